"""One quarantine per run (consumer/stager/quarantine.py run_quarantine): every training
worker's run directory links to the run's file, so a run resumed with another number
of workers never tries again an item an earlier worker quarantined; several stagers
append to it, and a settle that finds another stager holding it keeps its lines."""

from __future__ import annotations

from pathlib import Path

from ringfeed.consumer.stager.quarantine import (
    QUARANTINE_FILE,
    QuarantineWriter,
    read_quarantine,
    run_quarantine,
)
from ringfeed.producer.causes import stage_causes
from ringfeed.shared.config import Config, replace
from ringfeed.shared.config.environment import run_dir
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.share import Share
from tests.support.paths import MINI

RUN = "r1"


def config(tmp_path: Path) -> Config:
    return replace(
        Config(),
        data={"path": str(MINI)},
        run_root=str(tmp_path / "runs"),
        features={"cache_dir": str(tmp_path / "cache")},
    )


def quarantine_of(cfg: Config, share: Share) -> Path:
    """What the stager of worker `share` opens (stager.py build)."""
    directory = run_dir(cfg, share.run_id(RUN))
    directory.mkdir(parents=True, exist_ok=True)
    return run_quarantine(directory, run_dir(cfg, share.base_run_id(share.run_id(RUN))))


def test_every_topology_of_a_run_shares_one_quarantine_and_skips_its_items(tmp_path) -> None:
    cfg = config(tmp_path)
    causes = stage_causes(cfg)
    first, second = Share(0, 2), Share(1, 2)
    with (
        QuarantineWriter(quarantine_of(cfg, first)) as q0,
        QuarantineWriter(quarantine_of(cfg, second)) as q1,
    ):
        assert q0.write("LJ001-0004", "/w/4.wav", "lease expired 3 times", "lease", causes["lease"])
        assert q1.write("LJ001-0008", "/w/8.wav", "empty audio", "audio", causes["audio"])
    the_file = run_dir(cfg, RUN) / QUARANTINE_FILE
    for k in range(2):
        link = run_dir(cfg, f"{RUN}-w{k}") / QUARANTINE_FILE
        assert link.is_symlink() and link.resolve() == the_file.resolve()
        assert [r["item_id"] for r in read_quarantine(link)] == ["LJ001-0004", "LJ001-0008"]
    index = open_corpus(cfg)
    for share in (Share(), Share(2, 3)):  # resumed on one worker, then on three
        with QuarantineWriter(quarantine_of(cfg, share)) as q:
            skips, retried = q.settle(index, causes)
        assert {index.item_id(k) for k in skips} == {"LJ001-0004", "LJ001-0008"}
        assert not retried


def test_a_workers_own_file_from_before_joins_the_runs(tmp_path) -> None:
    cfg = config(tmp_path)
    own = run_dir(cfg, f"{RUN}-w1") / QUARANTINE_FILE
    with QuarantineWriter(own) as q:  # one file per worker directory, as before
        q.write("LJ001-0009", "/w/9.wav", "lease expired 3 times", "lease")
    path = quarantine_of(cfg, Share(1, 2))
    assert own.is_symlink() and own.resolve() == path
    assert [r["item_id"] for r in read_quarantine(run_dir(cfg, RUN) / QUARANTINE_FILE)] == [
        "LJ001-0009"
    ]


def test_a_settle_beside_another_stager_keeps_the_lines_and_loses_no_append(tmp_path) -> None:
    cfg = config(tmp_path)
    causes = stage_causes(cfg)
    path = quarantine_of(cfg, Share(0, 2))
    with QuarantineWriter(path) as q:  # a verdict of another normalizer: stale today
        q.write("LJ001-0004", "/w/4.wav", "no text", "text", "0badc0de another normalizer")
    index = open_corpus(cfg)
    with QuarantineWriter(quarantine_of(cfg, Share(1, 2))) as other, QuarantineWriter(path) as q:
        skips, retried = q.settle(index, causes)
        assert retried == {"text": 1} and not skips
        assert len(read_quarantine(path)) == 1, "another stager holds the file: no rewrite"
        assert q.write("LJ001-0004", "/w/4.wav", "still no text", "text", causes["text"])
        assert other.write("LJ001-0008", "/w/8.wav", "empty audio", "audio", causes["audio"])
    records = read_quarantine(path)
    assert [r["item_id"] for r in records] == ["LJ001-0004", "LJ001-0004", "LJ001-0008"]
    assert records[1]["cause"] == causes["text"]  # the last line of an input is its verdict
    with QuarantineWriter(path) as q:  # alone now: the next start skips it, retries nothing
        skips, retried = q.settle(index, causes)
    assert {index.item_id(k) for k in skips} == {"LJ001-0004", "LJ001-0008"} and not retried
