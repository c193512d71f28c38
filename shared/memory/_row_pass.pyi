# The C extension's face (shared/memory/_row_pass.c), for the type checker.
from typing_extensions import Buffer

def field(src: Buffer, dst: Buffer | None, kind: int, limit: int, /) -> tuple[int, bool]: ...
def rows(
    fields: Buffer,
    row_bytes: int,
    rows: Buffer,
    used: Buffer,
    kind: int,
    limit: int,
    hashes: Buffer,
    ok: Buffer,
    /,
) -> None: ...
