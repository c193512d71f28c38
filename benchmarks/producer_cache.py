"""Producer cost with a cold and a warm feature cache, against raw librosa, side by side.

    .venv/bin/python benchmarks/producer_cache.py [--rounds 3] [--passes 5] [--seconds 2]

Data: the 16 clips of data/ljspeech-mini (22050 Hz mono, so no resampling),
``features.on_too_long: truncate`` so all 16 are used, each round going
``--passes`` times over them (80 samples). Math libraries are pinned to one
thread (``pin_math_threads(1)``) in this process and every child, as in a
producer. Measured:

- raw: ``soundfile.read`` + ``librosa.feature.melspectrogram`` (the settings
  of producer/features/mel.py) + ``np.log``, per clip, cut to the same length the
  pipeline keeps (three clips are truncated to 800 frames), librosa warmed up;
- cold: one ``SamplePipeline`` per pass on an empty cache in a fresh directory
  (tokenize, decode, normalize, mel, cache write): the producer's first epoch;
- warm: one ``SamplePipeline`` on a filled cache (key, mmap view, CRC check;
  no decode, no mel), after one untimed pass, for WARM_PASS_FACTOR x the
  passes (80 warm samples take under 10 ms: too short to time);
- warm x1 / x2: one and two spawned processes reading the same warm cache for
  ``--seconds``, started together at a barrier; aggregate samples/s;
- RSS: VmRSS (and its anonymous / file-backed parts) of one spawned warm
  producer after warm_up, after one pass and after ``--rss-passes`` passes.

The cold stage breakdown calls the functions the pipeline calls (text
encode, load_audio, log_mel, cache key + put) one at a time on the same clips.
The rounds alternate the measurements so machine noise hits them alike; the
table gives medians and ratios. On a shared 2-core machine the numbers move
by 10-20 % between runs.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from ringfeed.producer.audio.decode import load_clip  # noqa: E402
from ringfeed.producer.features.mel import fit_length, log_mel  # noqa: E402
from ringfeed.producer.pipeline import SamplePipeline  # noqa: E402
from ringfeed.producer.process.threads import pin_math_threads  # noqa: E402
from ringfeed.producer.text.encoder import TextEncoder  # noqa: E402
from ringfeed.shared.config import Config, config_from_dict  # noqa: E402
from ringfeed.shared.config.audio import RESAMPLE_QUALITY  # noqa: E402
from ringfeed.shared.corpus.clips import ClipReader  # noqa: E402
from ringfeed.shared.corpus.entry import Entry  # noqa: E402
from ringfeed.shared.corpus.feature_cache import FeatureCache  # noqa: E402
from ringfeed.shared.corpus.open import read_corpus  # noqa: E402
from tests.support.audio import librosa_log_mel  # noqa: E402

BATCH_SIZE = 8
CHILD_TIMEOUT_S = 120.0
WARM_PASS_FACTOR = 20


def make_raw(cache_dir: Path) -> dict:
    """The config mapping of every measurement; only cache_dir differs."""
    raw = {
        "data": {"path": str(REPO / "data" / "ljspeech-mini")},
        "features": {"cache_dir": str(cache_dir), "on_too_long": "truncate"},
        "stager": {"batch_size": BATCH_SIZE},
    }
    return raw


def entries_of(cfg: Config) -> list[Entry]:
    entries, bad = read_corpus(cfg)
    assert not bad and len(entries) == 16, f"expected 16 usable clips, got {len(entries)}"
    return entries


def run_passes(pipe: SamplePipeline, entries: list[Entry], passes: int) -> float:
    """-> samples/s of pipe over entries, `passes` times."""
    t0 = time.perf_counter()
    for _ in range(passes):
        for entry in entries:
            pipe(entry)
    return passes * len(entries) / (time.perf_counter() - t0)


# ------------------------------------------------------------ in this process


def raw_mel(path: str, cfg: Config) -> np.ndarray:
    """What librosa alone costs: read, resample if needed, melspectrogram, log."""
    import soundfile as sf
    import soxr

    sr_out = cfg.audio.sample_rate
    wave, sr = sf.read(path, dtype="float32")
    if sr != sr_out:  # never for ljspeech-mini: all clips are 22050 Hz
        wave = soxr.resample(wave, sr, sr_out, quality=RESAMPLE_QUALITY)
    wave = wave[: cfg.max_samples - 1]  # the pipeline's truncation: same frames
    return librosa_log_mel(wave, cfg)


def bench_raw(cfg: Config, entries: list[Entry], passes: int) -> float:
    raw_mel(entries[0].audio_path, cfg)  # librosa's first call (imports, numba) excluded
    t0 = time.perf_counter()
    for _ in range(passes):
        for entry in entries:
            raw_mel(entry.audio_path, cfg)
    return passes * len(entries) / (time.perf_counter() - t0)


def bench_cold(entries: list[Entry], passes: int, tmp: Path) -> float:
    """Every sample a miss: a fresh cache directory and pipeline per pass (a first epoch)."""
    seconds = 0.0
    for _ in range(passes):
        cfg = config_from_dict(make_raw(tmp / f"cold-{uuid.uuid4().hex[:8]}"))
        pipe = SamplePipeline(cfg)
        pipe.warm_up()
        seconds += len(entries) / run_passes(pipe, entries, 1)
        assert pipe.counters.mels == len(entries) and pipe.counters.cache_hits == 0
        pipe.close()
    return passes * len(entries) / seconds


def bench_warm(cfg: Config, entries: list[Entry], passes: int) -> float:
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    run_passes(pipe, entries, 1)  # maps the shard, fills the text cache
    rate = run_passes(pipe, entries, passes * WARM_PASS_FACTOR)
    assert pipe.counters.mels == 0, "the warm cache missed"
    pipe.close()
    return rate


def cold_stages(entries: list[Entry], tmp: Path) -> dict[str, float]:
    """ms per sample of each cold-path stage, calling what the pipeline calls."""
    cfg = config_from_dict(make_raw(tmp / f"stages-{uuid.uuid4().hex[:8]}"))
    text, cache, clips = TextEncoder(cfg), FeatureCache(cfg), ClipReader(cfg)
    times = dict.fromkeys(("text", "load_audio", "log_mel", "cache key+put"), 0.0)
    for entry in entries:
        t0 = time.perf_counter()
        text.encode(entry.text, entry.audio_path)
        t1 = time.perf_counter()
        wave, truncated = fit_length(load_clip(clips, entry, cfg)[0], cfg)
        t2 = time.perf_counter()
        mel = log_mel(wave, cfg)
        t3 = time.perf_counter()
        cache.put(cache.key(entry), mel, truncated)
        t4 = time.perf_counter()
        for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[name] += dt
    cache.close()
    return {name: 1e3 * t / len(entries) for name, t in times.items()}


# ------------------------------------------------------------ spawned producers


def _warm_child(raw: dict, seconds: float, barrier, results) -> None:
    pin_math_threads(1)
    cfg = config_from_dict(raw)
    entries = entries_of(cfg)
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    run_passes(pipe, entries, 1)
    barrier.wait(CHILD_TIMEOUT_S)
    n, t0 = 0, time.perf_counter()
    for entry in itertools.cycle(entries):
        pipe(entry)
        n += 1
        if time.perf_counter() - t0 >= seconds:
            break
    results.put((n / (time.perf_counter() - t0), pipe.counters.mels))


def bench_parallel(raw: dict, procs: int, seconds: float) -> float:
    """Aggregate samples/s of `procs` spawned processes on the same warm cache."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(procs + 1), ctx.Queue()
    children = [
        ctx.Process(target=_warm_child, args=(raw, seconds, barrier, results)) for _ in range(procs)
    ]
    for child in children:
        child.start()
    barrier.wait(CHILD_TIMEOUT_S)
    got = [results.get(timeout=CHILD_TIMEOUT_S) for _ in children]
    for child in children:
        child.join(CHILD_TIMEOUT_S)
    assert all(mels == 0 for _, mels in got), "a warm producer computed mels"
    return sum(rate for rate, _ in got)


def _rss_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0])
    return fields


def _rss_child(raw: dict, passes: int, results) -> None:
    pin_math_threads(1)
    cfg = config_from_dict(raw)
    entries = entries_of(cfg)
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    start = _rss_kib()
    run_passes(pipe, entries, 1)
    after_one = _rss_kib()
    run_passes(pipe, entries, passes - 1)
    results.put((start, after_one, _rss_kib(), pipe.counters.mels))


def measure_rss(raw: dict, passes: int) -> tuple[dict, dict, dict]:
    """VmRSS/RssAnon/RssFile in KiB of a warm producer: after warm_up, pass 1, last pass."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_rss_child, args=(raw, passes, results))
    child.start()
    start, after_one, end, mels = results.get(timeout=CHILD_TIMEOUT_S)
    child.join(CHILD_TIMEOUT_S)
    assert mels == 0, "the RSS run missed the warm cache"
    return start, after_one, end


# ------------------------------------------------------------ main


def one_round(args: argparse.Namespace, tmp: Path, warm_dir: Path) -> dict[str, float]:
    warm_raw = make_raw(warm_dir)
    warm_cfg = config_from_dict(warm_raw)
    entries = entries_of(warm_cfg)
    rates = {
        "raw librosa": bench_raw(warm_cfg, entries, args.passes),
        "cold": bench_cold(entries, args.passes, tmp),
        "warm": bench_warm(warm_cfg, entries, args.passes),
        "warm x1 proc": bench_parallel(warm_raw, 1, args.seconds),
        "warm x2 procs": bench_parallel(warm_raw, 2, args.seconds),
    }
    stages = cold_stages(entries, tmp)
    rates.update({f"  {k} ms": v for k, v in stages.items()})
    return rates


def print_table(
    med: dict[str, float], rss: tuple[dict, dict, dict], args: argparse.Namespace
) -> None:
    print(
        f"\nmedian of {args.rounds} rounds, {args.passes} passes x 16 clips, "
        f"{args.seconds:g} s per parallel run, math threads 1"
    )
    for k in ("raw librosa", "cold", "warm", "warm x1 proc", "warm x2 procs"):
        print(f"{k:20s} {med[k]:10,.1f} samples/s   {1e3 / med[k]:8.3f} ms/sample")
    cold_ms = 1e3 / med["cold"]
    print("cold path, ms/sample by stage:")
    for k in (k for k in med if k.startswith("  ")):
        print(f"{k:20s} {med[k]:8.3f} ms   {100 * med[k] / cold_ms:5.1f} % of cold")
    start, after_one, end = rss
    for name, d in (("start", start), ("pass 1", after_one), (f"pass {args.rss_passes}", end)):
        print(
            f"producer RSS {name:8s} {d['VmRSS'] / 1024:7.1f} MiB "
            f"(anon {d['RssAnon'] / 1024:.1f}, file {d['RssFile'] / 1024:.1f})"
        )
    overhead = med["raw librosa"] / med["cold"] - 1
    print(f"warm / cold                 = {med['warm'] / med['cold']:8.1f}x   (target >= 10x)")
    print(f"cold overhead over librosa  = {100 * overhead:+8.1f} %  (target < 10 %)")
    print(
        f"warm x2 procs / x1          = {med['warm x2 procs'] / med['warm x1 proc']:8.2f}x   "
        "(target >= 1.5x)"
    )
    growth = 100 * (end["VmRSS"] / start["VmRSS"] - 1)
    steady = 100 * (end["VmRSS"] / after_one["VmRSS"] - 1)
    print(
        f"RSS growth over run         = {growth:+8.1f} %  (after pass 1: {steady:+.1f} %; "
        "target < 5 %)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rss-passes", type=int, default=200)
    args = parser.parse_args()
    pin_math_threads(1)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm_dir = tmp / "warm-cache"
        fill = SamplePipeline(config_from_dict(make_raw(warm_dir)))
        fill.warm_up()
        run_passes(fill, entries_of(fill.cfg), 1)
        fill.close()
        for r in range(args.rounds):
            for k, v in one_round(args, tmp, warm_dir).items():
                results.setdefault(k, []).append(v)
            print(
                f"round {r + 1}: "
                + ", ".join(f"{k.strip()} {v[-1]:,.2f}" for k, v in results.items()),
                flush=True,
            )
        rss = measure_rss(make_raw(warm_dir), args.rss_passes)
    print_table({k: statistics.median(v) for k, v in results.items()}, rss, args)


if __name__ == "__main__":
    main()
