"""ringfeed.torch's loader given a config and no run starts the run's stager and
producers itself and ends them with the loop: as a notebook does, two loaders one after
the other in this process (a dict config, then a Config), each run to its end, leave no
child process and no segment; a stager that dies at start is named with its log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import config_from_dict
from tests.support.runs import shm_segments

torch = pytest.importorskip("torch")

from ringfeed.torch import RingLoader, StagerGone  # noqa: E402

pytestmark = pytest.mark.slow

N = 24


def raw(tmp_path: Path, **stager: object) -> dict:
    return {
        "data": {"format": "synthetic", "synthetic_items": N},
        "features": {"max_frames": 32, "cache": False},
        "text": {"max_text_len": 32},
        "stager": {"batch_size": 8, "epochs": 2} | stager,
        "producers": {"workers": 1},
        "run_root": str(tmp_path / "runs"),
    }


def children() -> list[int]:
    """This process's live child processes."""
    pid = os.getpid()
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in found]


def test_two_loaders_in_one_process_start_and_end_their_data_sides(tmp_path: Path) -> None:
    before = children()
    runs = []
    for cfg in (raw(tmp_path), config_from_dict(raw(tmp_path))):
        with RingLoader(cfg, progress_every=0) as loader:
            assert len(children()) == len(before) + 2, "a stager and a producer pool"
            passes = []
            for _ in range(2):
                items = []
                for batch in loader:
                    arrays = {name: t.numpy() for name, t in batch.items()}
                    items += check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
                passes.append(sorted(items))
        assert loader.finished and passes == [list(range(N))] * 2
        runs.append(loader.run_id)
        assert children() == before, "the data side ended with the loop"
        assert shm_segments(loader.run_id) == []
    assert runs[0] != runs[1]


def test_a_stager_that_dies_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    """A batch ring larger than /dev/shm: the stager refuses it at its start."""
    cfg = raw(tmp_path)
    cfg["features"]["max_frames"] = 4_000_000  # 8 rows x 4 M frames x 80 mels: 10 GB a slot
    loader = RingLoader(cfg, progress_every=0)
    with pytest.raises(StagerGone, match=r"the stager this loader started exited .* its log"):
        next(iter(loader))
    loader.close()
