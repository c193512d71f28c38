"""ringfeed against tf.data on the cold and the cached path: same clips, same batch, same threads.

    .venv/bin/python benchmarks/peers.py [--rounds 2] [--clips 512] [--baseline DIR]
    .venv/bin/python benchmarks/peers.py --quick          # 1 round, 256 clips: ~2 min
    .venv/bin/python benchmarks/peers.py --quick --plot PNG   # also draw the result

Data: ``--clips`` crops of the 16 shipped LJSpeech clips (22050 Hz 16-bit PCM, so
no variant resamples), 1-9.5 s long, written once into a temporary LJSpeech
layout with their transcripts. Every variant turns each clip into tokens and a
log-mel [<= 800, 80] (n_fft 1024, hop 256, Slaney filterbank, clips cut to 800
frames) and batches of 32 padded to [32, 800, 80], with two workers and math
libraries pinned to one thread:

- tfdata-ops: the strongest pipeline a TensorFlow user builds from TensorFlow
  ops only: ``read_file``, ``decode_wav``, peak normalization, ``tf.signal.stft``,
  the same mel matrix, ``map(num_parallel_calls=AUTOTUNE)``, ``padded_batch``,
  ``prefetch``; a private tf.data pool of 2 threads, 1 intra-op thread;
- tfdata-librosa: what the old pipeline did: ``tf.numpy_function`` around
  soundfile + ``librosa.feature.melspectrogram`` (benchmarks/producer_cache.py's
  ``raw_mel``) and the producer's tokenizer, same pool;
- ringfeed-cold: a real run (stager, 2 producers, this benchmark's child as the
  batch client, ``benchmarks/live_run.py``), feature cache on and empty: the
  first epoch of every run (decode, mel, tokens, cache write);
- ringfeed-cached: a real run over the cache that ringfeed-cold of the same
  round filled, CACHED_EPOCHS epochs;
- ringfeed-cold@baseline (with ``--baseline DIR``, a checkout of other code):
  ringfeed-cold run from that checkout, to compare ringfeed with itself.

Each variant runs in its own process (TensorFlow stays out of ringfeed's) and
reports samples over the time from its first batch to its last (start-up, TF
graph building and XLA excluded alike), and the CPU time all its processes and
threads used in that window per sample (/proc): on a shared machine the rate
depends on what else runs, the CPU cost per sample much less. The rounds alternate the variants, so
machine noise hits them alike; the table gives each median and its ratio to
tfdata-ops; ``--plot PATH`` draws the medians (benchmarks/charts.py) for
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from charts import draw_bars, run_label

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "data" / "ljspeech-mini"
VARIANTS = ("tfdata-ops", "ringfeed-cold", "tfdata-librosa", "ringfeed-cached")
# The order of odd rounds: every variant moves, ringfeed-cached still follows the
# ringfeed-cold that fills its cache.
ODD_ORDER = ("ringfeed-cold@baseline", "ringfeed-cold", "tfdata-ops", "ringfeed-cached",
             "tfdata-librosa")  # fmt: skip
BATCH = 32
WORKERS = 2
# Epochs of the cached run: one epoch of 512 cached samples is ~0.1 s, too short to time.
CACHED_EPOCHS = 4
MIN_S, MAX_S = 1.0, 9.5
RUN_TIMEOUT_S = 600.0
RESULT_TAG = "PEERS_RESULT "


def make_corpus(root: Path, n: int, seed: int = 0) -> Path:
    """n crops (1-9.5 s, from random offsets) of the shipped clips, LJSpeech layout."""
    import soundfile as sf

    lines = [line.split("|") for line in (CLIPS / "metadata.csv").read_text().splitlines()]
    rng = np.random.default_rng(seed)
    (root / "wavs").mkdir(parents=True)
    out = []
    for i in range(n):
        clip_id, text = lines[i % len(lines)][0], lines[i % len(lines)][1]
        wave, sr = sf.read(CLIPS / "wavs" / f"{clip_id}.wav", dtype="int16")
        n_keep = min(len(wave), int(rng.uniform(MIN_S, MAX_S) * sr))
        start = int(rng.integers(0, len(wave) - n_keep + 1))
        sf.write(root / "wavs" / f"c{i:05d}.wav", wave[start : start + n_keep], sr, "PCM_16")
        out.append(f"c{i:05d}|{text}|{text}")
    (root / "metadata.csv").write_text("\n".join(out) + "\n")
    return root


def bench_raw(corpus: Path, cache_dir: Path, epochs: int) -> dict:
    """The config mapping of the ringfeed runs (as YAML would give it)."""
    return {
        "data": {"path": str(corpus)},
        "features": {"cache": True, "cache_dir": str(cache_dir), "on_too_long": "truncate"},
        "stager": {"batch_size": BATCH, "epochs": epochs},
        "producers": {"workers": WORKERS, "math_threads": 1},
        "run_root": str(cache_dir.parent / "runs"),
    }


# ------------------------------------------------------------ children


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its descendants
    alive now (ringfeed's stager, producer pool and its workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents, cpu = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        parents[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, me = 0.0, os.getpid()
    for pid in cpu:
        p = pid
        while p > 1 and p != me:
            p = parents.get(p, 0)
        total += cpu[pid] if p == me else 0.0
    return total


def timed(batches) -> dict:
    """Samples per second from the first batch to the last, and CPU ms per sample over
    that window (every process of the pipeline). batches yields each batch's n_valid,
    then 0 while the pipeline still runs: /proc is read only then and at the first
    batch (a scan per batch would cost this process ~4 ms each)."""
    total = first = 0
    t_first = t_last = time.perf_counter()
    cpu_first = cpu_last = 0.0
    for n in batches:
        if n == 0:
            cpu_last = tree_cpu_s()
            continue
        if total == 0:
            first, t_first, cpu_first = n, time.perf_counter(), tree_cpu_s()
        total += n
        t_last = time.perf_counter()
    timed_samples = max(total - first, 1)
    return {
        "samples": total,
        "rate": (total - first) / max(t_last - t_first, 1e-9),
        "cpu_ms": 1e3 * (cpu_last - cpu_first) / timed_samples,
    }


def run_ringfeed(corpus: Path, cache_dir: Path, epochs: int, tmp: Path) -> dict:
    from live_run import live_run  # the checkout on sys.path: this one, or --baseline's

    def batches():
        with live_run(bench_raw(corpus, cache_dir, epochs), tmp) as client:
            while (batch := client.next(timeout_s=120)) is not None:
                n = batch.meta.n_valid
                client.free(batch)
                yield n
            yield 0  # the end of data: the run's processes are still there to be read

    return timed(batches())


def _tf_setup():
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    options = tf.data.Options()
    options.threading.private_threadpool_size = WORKERS
    options.threading.max_intra_op_parallelism = 1
    return tf, options


def tf_ops_dataset(cfg, paths: list[str], texts: list[str]):
    """decode_wav -> peak normalize -> tf.signal.stft -> mel matrix -> log, padded batches."""
    from ringfeed.producer.features import mel_filterbank
    from ringfeed.shared.sample.content import LOG_FLOOR

    tf, options = _tf_setup()
    f, max_n = cfg.features, cfg.max_samples - 1
    fb = tf.constant(mel_filterbank(cfg).T)
    peak = cfg.audio.peak_level

    def load(path, text):
        wave, _ = tf.audio.decode_wav(tf.io.read_file(path), desired_channels=1)
        wave = wave[:max_n, 0]
        wave = wave * (peak / tf.reduce_max(tf.abs(wave)))
        padded = tf.pad(wave, [[f.n_fft // 2, f.n_fft // 2]])
        spec = tf.signal.stft(padded, f.win_length, f.hop_length, f.n_fft, pad_end=False)
        mel = tf.math.log(tf.maximum(tf.matmul(tf.abs(spec), fb), LOG_FLOOR))
        chars = tf.strings.unicode_decode(tf.strings.lower(text), "UTF-8")
        tokens = tf.minimum(chars[: cfg.text.max_text_len], 255)
        return {"tokens": tokens, "mel": mel, "mel_lens": tf.shape(mel)[0]}

    shapes = {"tokens": [cfg.text.max_text_len], "mel": [f.max_frames, f.n_mels], "mel_lens": []}
    ds = tf.data.Dataset.from_tensor_slices((paths, texts)).with_options(options)
    return (
        ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        .padded_batch(BATCH, padded_shapes=shapes)
        .prefetch(tf.data.AUTOTUNE)
    )


def tf_librosa_dataset(cfg, paths: list[str], texts: list[str]):
    """tf.numpy_function around soundfile + librosa (the old pipeline), padded batches."""
    from producer_cache import raw_mel

    from ringfeed.producer.text import TextEncoder

    tf, options = _tf_setup()
    f, encoder = cfg.features, TextEncoder(cfg)
    raw_mel(paths[0], cfg)  # librosa's first call (imports, numba) is not the pipeline's

    def load(i):
        mel = raw_mel(paths[int(i)], cfg).astype(np.float32)
        tokens, _ = encoder.encode(texts[int(i)], paths[int(i)])
        return tokens.astype(np.int32), mel, np.int32(len(mel))

    def to_dict(i):
        tokens, mel, n = tf.numpy_function(load, [i], (tf.int32, tf.float32, tf.int32))
        tokens.set_shape([None])
        mel.set_shape([None, f.n_mels])
        n.set_shape([])
        return {"tokens": tokens, "mel": mel, "mel_lens": n}

    shapes = {"tokens": [cfg.text.max_text_len], "mel": [f.max_frames, f.n_mels], "mel_lens": []}
    ds = tf.data.Dataset.from_tensor_slices(np.arange(len(paths))).with_options(options)
    return (
        ds.map(to_dict, num_parallel_calls=tf.data.AUTOTUNE)
        .padded_batch(BATCH, padded_shapes=shapes)
        .prefetch(tf.data.AUTOTUNE)
    )


def run_tf(variant: str, corpus: Path) -> dict:
    from ringfeed.shared.config import config_from_dict

    cfg = config_from_dict(bench_raw(corpus, corpus / "unused", 1))
    rows = [line.split("|") for line in (corpus / "metadata.csv").read_text().splitlines()]
    paths = [str(corpus / "wavs" / f"{r[0]}.wav") for r in rows]
    texts = [r[1] for r in rows]
    make = tf_ops_dataset if variant == "tfdata-ops" else tf_librosa_dataset
    ds = make(cfg, paths, texts)
    out = timed(itertools.chain((int(b["mel_lens"].shape[0]) for b in ds), [0]))
    out["parity"] = tf_parity(cfg, paths[0]) if variant == "tfdata-ops" else None
    return out


def tf_parity(cfg, path: str) -> float:
    """Largest |log-mel difference| of tfdata-ops against the producer where the mel is
    above 2e-4 (the two really compute the same thing)."""
    from ringfeed.producer.audio import load_audio
    from ringfeed.producer.features import fit_length, log_mel

    wave, _ = fit_length(load_audio(path, cfg), cfg)
    ours = log_mel(wave, cfg)
    theirs = next(iter(tf_ops_dataset(cfg, [path], ["a"])))["mel"].numpy()[0, : len(ours)]
    above = ours > -8.5
    return float(np.abs(ours - theirs)[above].max())


def import_from(repo: Path) -> None:
    """Put `repo` first on sys.path and make sure its ringfeed is the one imported (a
    checkout older than ringfeed/'s links to its folders would mix in this one's)."""
    sys.path[:0] = [str(repo), str(repo / "benchmarks")]
    import ringfeed

    where = Path(ringfeed.__file__).resolve().parent.parent
    if where != repo.resolve():
        raise SystemExit(f"{repo}: imports ringfeed from {where}; a checkout from before "
                         "ringfeed/ linked its folders needs the links: cd ringfeed && ln -s "
                         "../shared ../producer ../consumer ../scripts .")  # fmt: skip


def child(args: argparse.Namespace) -> None:
    import_from(Path(args.repo))
    corpus, cache_dir = Path(args.corpus), Path(args.cache_dir)
    if args.child.startswith("ringfeed"):
        epochs = CACHED_EPOCHS if args.child == "ringfeed-cached" else 1
        out = run_ringfeed(corpus, cache_dir, epochs, cache_dir.parent)
    else:
        out = run_tf(args.child, corpus)
    print(RESULT_TAG + json.dumps(out), flush=True)


# ------------------------------------------------------------ parent


def spawn(variant: str, repo: Path, corpus: Path, cache_dir: Path) -> dict:
    from ringfeed.producer.threads import math_thread_env

    env = (
        os.environ | math_thread_env(1) | {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    )
    cmd = [sys.executable, __file__, "--child", variant.split("@")[0], "--repo", str(repo)]
    cmd += ["--corpus", str(corpus), "--cache-dir", str(cache_dir)]
    # cwd=repo: the run's processes (python -m ringfeed...) import from their working
    # directory, so a --baseline run must start there or it runs this checkout's code.
    proc = subprocess.run(
        cmd, env=env, cwd=repo, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"{variant} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def print_table(
    rates: dict[str, list[float]],
    cpu: dict[str, list[float]],
    args: argparse.Namespace,
    parity: float,
) -> None:
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items() if v}
    base = med["tfdata-ops"]
    print(
        f"\n{args.clips} clips of {MIN_S:g}-{MAX_S:g} s, batch {BATCH}, {WORKERS} workers, "
        f"math libraries on 1 thread, {args.rounds} round(s), alternated\n"
    )
    print("| pipeline | samples/s (each round) | median | vs tfdata-ops | CPU ms/sample |")
    print("|---|---|---:|---:|---:|")
    for k, v in rates.items():
        each = " / ".join(f"{x:,.0f}" for x in v)
        print(f"| {k} | {each} | {med[k]:,.0f} | {med[k] / base:.2f}x | {cpu_med[k]:.2f} |")
    print(f"\ntfdata-ops log-mel against the producer's (values above 2e-4): max diff {parity:.1e}")


def plot(rates: dict[str, list[float]], cpu: dict[str, list[float]], path: str) -> None:
    """Median samples/s (log scale: cached is ~7x cold) and CPU ms per sample of each."""
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    cpu_med = {k: statistics.median(cpu[k]) for k in med}
    draw_bars(
        path,
        f"Clips to padded batches of {BATCH}, {WORKERS} workers each (median)",
        [("samples/s (log scale)", med), ("CPU ms per sample, all processes", cpu_med)],
        run_label("peers.py"),
        log_x=[True, False],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clips", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="1 round of 256 clips")
    parser.add_argument("--baseline", help="a checkout whose ringfeed-cold to run alongside")
    parser.add_argument("--plot", help="also draw the medians into this PNG")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--repo", default=str(REPO), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.rounds, args.clips = 1, 256
    sys.path.insert(0, str(REPO))
    variants = list(VARIANTS) + (["ringfeed-cold@baseline"] if args.baseline else [])
    rates: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    parity = float("nan")
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        corpus = make_corpus(Path(tmp) / "corpus", args.clips)
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else [v for v in ODD_ORDER if v in variants]
            for v in order:
                repo = Path(args.baseline) if v.endswith("@baseline") else REPO
                cache_dir = Path(tmp) / f"r{r}" / ("base" if "@" in v else "cache")
                cache_dir.parent.mkdir(exist_ok=True)
                out = spawn(v, repo, corpus, cache_dir)
                rates[v].append(out["rate"])
                cpu[v].append(out["cpu_ms"])
                parity = out.get("parity") or parity
                print(f"round {r + 1}: {v} {out['rate']:,.0f} samples/s, "
                      f"{out['cpu_ms']:.2f} CPU ms/sample", flush=True)  # fmt: skip
    print_table(rates, cpu, args, parity)
    if args.plot:
        plot(rates, cpu, args.plot)


if __name__ == "__main__":
    main()
