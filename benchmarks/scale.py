"""Corpora of millions of clips: the corpus index's build, reuse, memory and first batch.

    .venv/bin/python benchmarks/scale.py [--items 10000000] [--rounds 2]
    .venv/bin/python benchmarks/scale.py --quick          # 200,000 items, one round
    .venv/bin/python benchmarks/scale.py --format jsonl --items 10000000 --build-only

Generates, under /tmp (never the repo; deleted at the end), a csv corpus
(`audio_file|text|speaker_name`, 1,000 folders, 500 speakers) of --items
entries, or with --format jsonl the same entries as a JSON-lines manifest (NeMo's
shape: audio, text, speaker, duration). The entries are cheap: their files do not
exist, except the first 256 positions of epoch 0's plan, which are links to the
shipped clips, so the first batches hold real audio (a producer granted a missing
file quarantines it, as it should). Then, on that corpus:

- build: `ringfeed index CONFIG` (a fresh process, cold: no index; a process per
  core parses the file) and its rate, beside the same build in one process (a
  fresh process, `build(cfg, workers=1)`): the baseline, in the same run;
- warm reuse: a fresh process opening the current index (stamp check + map);
- first batch: stager + 2 producers started as `ringfeed run` starts them, with a
  warm index, seconds to the first full batch held here (the consumer);
- memory: RSS of the stager and of each producer once the first batch is here,
  above the same run on the 16 shipped clips (an "empty run"), rounds alternated.

Targets (issue 21): build >= 200,000 entries/s, warm reuse <= 1 s, first batch
<= 2 s with a warm index, stager and each producer <= 100 MB above an empty run;
(issue 32) 10,000,000 JSON lines built at >= 250,000 lines/s. --build-only stops
after the builds.

--prepare-against DIR (issue 43) times `ringfeed prepare` (a fresh process, cold) in
--rounds rounds alternated with what the checkout DIR (e.g. a git worktree of main)
ran for the same corpus before preparation existed, `ringfeed index`, and prints each
round and the medians: with --lengths the config reads the length table (data.outliers:
skip, the default), so prepare measures it and DIR runs `ringfeed lengths` after its
index; without, the index is all a run of the config reads (data.outliers: keep).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.consumer.stager.plan.plan import Plan  # noqa: E402
from ringfeed.consumer.stager.plan.shuffle import Shuffle  # noqa: E402
from ringfeed.scripts.runner import Run, worker_pids  # noqa: E402

MINI = REPO / "data" / "ljspeech-mini"
REAL_POSITIONS = 256
TIMEOUT_S = 300.0
SEED = 0


def make_corpus(root: Path, n_items: int, fmt: str = "csv") -> Path:
    """metadata.csv (or train.jsonl) of n_items entries; the first REAL_POSITIONS of the
    plan are real."""
    clips = sorted((MINI / "wavs").glob("*.wav"))
    plan = Plan(Shuffle(n_items, SEED))
    real = {plan.item_at(p) for p in range(min(REAL_POSITIONS, n_items))}
    for k in sorted(real):
        path = root / f"d{k % 1000:03d}" / f"c{k:08d}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(clips[k % len(clips)], path)
    metadata = root / ("train.jsonl" if fmt == "jsonl" else "metadata.csv")
    with open(metadata, "w") as f:
        f.write("" if fmt == "jsonl" else "audio_file|text|speaker_name\n")
        step = 500_000
        for start in range(0, n_items, step):
            f.write("".join(_line(k, fmt) for k in range(start, min(n_items, start + step))))
    return metadata


def _line(k: int, fmt: str) -> str:
    audio, text = f"d{k % 1000:03d}/c{k:08d}.wav", f"Printing, in the only sense {k}."
    if fmt == "jsonl":
        return (
            f'{{"audio": "{audio}", "text": "{text}", "speaker": "s{k % 500}", '
            f'"duration": {2 + k % 700 / 100}}}\n'
        )
    return f"{audio}|{text}|s{k % 500}\n"


def write_config(tmp: Path, data: Path, fmt: str, name: str, outliers: str = "skip") -> Path:
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    raw["data"] = {**raw.get("data", {}), "path": str(data), "format": fmt, "outliers": outliers}
    raw["features"] = {**raw.get("features", {}), "cache_dir": str(tmp / f"cache-{name}")}
    raw["stager"] = {**raw.get("stager", {}), "seed": SEED}
    raw["run_root"] = str(tmp / "runs")
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children that have ended, theirs
    included: on a machine shared with others, what a build costs whatever the load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_s(config: Path) -> tuple[float, dict, float]:
    """Wall seconds of `ringfeed index CONFIG` in a fresh process, the index header, and
    the CPU seconds of that process and its pool."""
    t0, cpu = time.perf_counter(), children_cpu_s()
    subprocess.run(
        [sys.executable, "-m", "ringfeed.scripts.cli", "index", str(config)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu
    return wall, header_of(config), cpu


def one_process_build_s(config: Path, repo: Path = REPO) -> tuple[float, float]:
    """Seconds of the same build in one process (a fresh one; imports excluded), and the
    CPU seconds of that process (imports included); repo: whose code builds (another
    checkout's, whose build may predate the workers argument)."""
    code = (
        "import sys, time; from ringfeed.shared.config import load_config; "
        "from ringfeed.shared.corpus.build import build; cfg = load_config(sys.argv[1]); "
        "t = time.perf_counter(); "
        "build(cfg, **({'workers': 1} if 'workers' in build.__code__.co_varnames else {})); "
        "print(time.perf_counter() - t)"
    )
    cpu = children_cpu_s()
    out = python_c(code, config, repo)
    return float(out.strip().splitlines()[-1]), children_cpu_s() - cpu


def python_c(code: str, config: Path, repo: Path = REPO) -> str:
    """What `python -c code CONFIG` prints: a fresh process running repo's code."""
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},  # repo's code first
    )
    return done.stdout


def header_of(config: Path) -> dict:
    code = (
        "import json, sys; from ringfeed.shared.config import load_config; "
        "from ringfeed.shared.corpus.index import index_path; "
        "from ringfeed.shared.corpus.index_file import IndexFile; "
        "h = IndexFile(index_path(load_config(sys.argv[1]))).header; h.pop('bad_lines'); "
        "print(json.dumps({k: h[k] for k in ('n_items', 'build_s', 'digest')}))"
    )
    out = python_c(code, config)
    return json.loads(out)


def reuse_s(config: Path) -> float:
    """Seconds a fresh process takes to open the current index (imports excluded)."""
    code = (
        "import sys, time; from ringfeed.shared.config import load_config; "
        "from ringfeed.shared.corpus.open import open_corpus; cfg = load_config(sys.argv[1]); "
        "t = time.perf_counter(); ix = open_corpus(cfg); ix.entry(ix.n_items - 1); "
        "print(time.perf_counter() - t)"
    )
    out = python_c(code, config)
    return float(out.strip().splitlines()[-1])


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of a process in MB (RSS counts the index's shared file pages)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def first_batch(config: Path, tmp: Path) -> dict:
    """Seconds to the first batch, and RSS of the stager and each producer then (a batch
    is a range of the plan's positions: an item skipped there leaves it a row short)."""
    run_id = f"scale-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    with Run(config, run_id, log_dir=tmp) as run:
        run.start("stager")
        run.start("producers")
        client = run.client("scale", timeout_s=TIMEOUT_S)
        batch = client.next(timeout_s=TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        assert batch is not None and batch.meta.n_valid >= 1
        stager = rss_mb(run.procs["stager"].pid)
        producers = [rss_mb(pid) for pid in worker_pids(run.procs["producers"].pid)]
        client.free(batch)
        client.close(finished=True)
    return {"first_batch_s": elapsed, "stager": stager, "producers": producers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="200,000 items, one round")
    parser.add_argument("--format", choices=["csv", "jsonl"], default="csv")
    parser.add_argument("--build-only", action="store_true", help="stop after the builds")
    parser.add_argument(
        "--against",
        type=Path,
        help="also build in one process with the "
        "code of this checkout (e.g. a git worktree of main)",
    )
    parser.add_argument(
        "--prepare-against",
        type=Path,
        help="time `ringfeed prepare` alternated with this checkout's index (and lengths)",
    )
    parser.add_argument(
        "--lengths",
        action="store_true",
        help="with --prepare-against: a config whose runs read the length table",
    )
    args = parser.parse_args()
    if args.quick:
        args.items, args.rounds = 200_000, 1
    tmp = Path(tempfile.mkdtemp(prefix="ringfeed-scale-", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        metadata = make_corpus(tmp / "corpus", args.items, args.format)
        size_mb = metadata.stat().st_size / 2**20
        print(
            f"corpus: {args.items:,} {args.format} entries, {size_mb:.0f} MB of metadata, "
            f"made in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        big = write_config(tmp, metadata, args.format, "big")
        empty = write_config(tmp, MINI, "ljspeech", "empty")
        if args.prepare_against is not None:
            outliers = "skip" if args.lengths else "keep"
            compare_prepare(
                write_config(tmp, metadata, args.format, "prep", outliers),
                args.items,
                args.prepare_against.resolve(),
                args.rounds,
            )
            return
        report_builds(big, args.items, args.against)
        if args.build_only:
            return
        build_s(empty)
        reuse = [reuse_s(big) for _ in range(3)]
        print(f"warm reuse: {statistics.median(reuse):.3f} s median of 3 (target <= 1 s)")
        runs: dict[str, list[dict]] = {"empty": [], "big": []}
        for r in range(args.rounds):
            for name, config in (("empty", empty), ("big", big)):
                runs[name].append(first_batch(config, tmp))
                got = runs[name][-1]
                producers = ", ".join(f"{p[0]:.0f}" for p in got["producers"])
                print(
                    f"round {r + 1} {name}: first batch {got['first_batch_s']:.2f} s, "
                    f"stager RSS {got['stager'][0]:.0f} MB, producers {producers} MB",
                    flush=True,
                )
        report(runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report_builds(config: Path, n_items: int, against: Path | None) -> None:
    """The build by `ringfeed index` (a process per core) beside one process's, and one
    process's with the code of the checkout `against`."""
    load = os.getloadavg()[0]
    wall, header, cpu = build_s(config)
    assert header["n_items"] == n_items, header
    rate = n_items / header["build_s"]
    print(
        f"build: {header['build_s']:.2f} s ({wall:.2f} s with the process), "
        f"{rate:,.0f} entries/s on {len(os.sched_getaffinity(0))} cores "
        f"(targets: csv >= 200,000, jsonl >= 250,000); CPU {cpu:.1f} s, "
        f"{cpu / n_items * 1e6:.2f} us an entry; load average {load:.1f} before",
        flush=True,
    )
    load = os.getloadavg()[0]
    one, cpu = one_process_build_s(config)
    print(
        f"one process: {one:.2f} s, {n_items / one:,.0f} entries/s; CPU {cpu:.1f} s, "
        f"{cpu / n_items * 1e6:.2f} us an entry; load average {load:.1f} before; "
        f"ratio {one / header['build_s']:.2f}x",
        flush=True,
    )
    if against is not None:
        old, cpu = one_process_build_s(config, against.resolve())
        print(
            f"one process, {against}'s code: {old:.2f} s, {n_items / old:,.0f} entries/s; "
            f"CPU {cpu:.1f} s; ratio {old / header['build_s']:.2f}x",
            flush=True,
        )


def timed(argv: list[str], repo: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds with its processes') of `python -m ringfeed.scripts.cli
    ARGV` run with repo's code, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(repo)}  # that checkout's code, whatever is installed
    t0, cpu = time.perf_counter(), children_cpu_s()
    subprocess.run(
        [sys.executable, "-m", "ringfeed.scripts.cli", *argv],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0, children_cpu_s() - cpu


def compare_prepare(config: Path, n_items: int, against: Path, rounds: int) -> None:
    """`ringfeed prepare` against `against`'s index (and lengths), cold, alternated."""
    reads_lengths = yaml.safe_load(config.read_text())["data"]["outliers"] != "keep"
    cache = Path(yaml.safe_load(config.read_text())["features"]["cache_dir"])
    walls: dict[str, list[float]] = {"before": [], "prepare": []}
    cpus: dict[str, list[float]] = {"before": [], "prepare": []}
    for r in range(rounds):
        for name in ("before", "prepare"):
            shutil.rmtree(cache, ignore_errors=True)  # cold: nothing prepared
            load = os.getloadavg()[0]
            if name == "before":
                wall, cpu = timed(["index", str(config)], against)
                if reads_lengths:
                    more = timed(["lengths", str(config)], against)
                    wall, cpu = wall + more[0], cpu + more[1]
            else:
                wall, cpu = timed(["prepare", str(config)], REPO)
            walls[name].append(wall)
            cpus[name].append(cpu)
            print(
                f"round {r + 1} {name}: {wall:.1f} s, {n_items / wall:,.0f} lines/s, CPU "
                f"{cpu / n_items * 1e6:.2f} us a line (load average {load:.1f} before)",
                flush=True,
            )
    what = "index and length table" if reads_lengths else "index"
    for name, got in walls.items():
        median, cpu = statistics.median(got), statistics.median(cpus[name])
        print(
            f"{name} ({what}): median {median:.1f} s, {n_items / median:,.0f} lines/s, CPU "
            f"{cpu / n_items * 1e6:.2f} us a line, of {rounds}"
        )
    shutil.rmtree(cache, ignore_errors=True)


def report(runs: dict[str, list[dict]]) -> None:
    def med(name: str, pick) -> float:
        return statistics.median(pick(got) for got in runs[name])

    first = med("big", lambda g: g["first_batch_s"])
    print(
        f"\nfirst full batch, warm index (median): {first:.2f} s (target <= 2 s); "
        f"empty run {med('empty', lambda g: g['first_batch_s']):.2f} s"
    )
    for what, k in (("RSS", 0), ("anonymous RSS", 1)):

        def stager(g: dict, k: int = k) -> float:
            return g["stager"][k]

        def producer(g: dict, k: int = k) -> float:
            return max(p[k] for p in g["producers"])

        above_s = med("big", stager) - med("empty", stager)
        above_p = med("big", producer) - med("empty", producer)
        print(
            f"{what} above an empty run: stager {above_s:+.0f} MB, each producer "
            f"{above_p:+.0f} MB (largest; target <= 100 MB)"
        )


if __name__ == "__main__":
    main()
