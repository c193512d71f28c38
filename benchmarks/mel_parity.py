"""Log-mel parity with librosa on the shipped clips, and what the stager's batch mel costs.

    .venv/bin/python benchmarks/mel_parity.py [--rounds 5] [--rows 8] [--frameworks torch,jax,tf]
        [--baseline DIR]
    python3 benchmarks/mel_parity.py --cufft      # on a GPU host with CuPy, no TensorFlow

Parity: the largest |log-mel - librosa's log-mel| (natural log, LOG_FLOOR applied to
both) over every frame of every shipped clip, whole clips (max_frames raised so none is
cut): the 16 clips of data/ljspeech-mini at the default features (22.05 kHz) and the 40
of data/multilingual-demo at configs/multilingual.yaml's (16 kHz). For the producers'
``log_mel`` (with the float64 FFT library the host picks, producer/features/fft.py) and for
the stager's batch log-mel in each framework (features.device: stager, as
consumer/devices.py builds it for devices.stager_framework), all clips of a corpus in one
batch. "Near floor" counts values within a factor 4.5 of LOG_FLOOR, where float32 STFTs
drift.

Cost: a batch of --rows LJSpeech clips (configs/demo.yaml's features, 800 frames; the 16
clips taken in turn, cut to fit; 8 rows is the demo's batch), the wall time of one stager
call (after a warm-up call) in each framework against the producers' ``log_mel`` of the
same clips one after the other (the work the stager takes from them), everything on one
thread, medians over --rounds of the best of CALLS calls. Each variant runs in a process
of its own per round, the variants alternating; with ``--baseline DIR`` (a checkout of
other code, e.g. an export of main) its TensorFlow stager mel is measured the same way.

--cufft: cuFFT (what TensorFlow calls on an NVIDIA GPU) through CuPy, the part of the
stager's mel whose arithmetic changed, rfft + magnitude of windowed frames in float32
against float64, for the demo's batch and a larger one; median of 50 CUDA-event timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5
CALLS = 5  # timed calls per process (the best one counts: scheduler noise only adds)


def _corpora():
    """[(name, cfg, waves)] of the parity corpora, whole clips, as producers load them."""
    from ringfeed.producer.audio.decode import load_clip
    from ringfeed.shared.config import Config, load_config, replace
    from ringfeed.shared.corpus.clips import ClipReader
    from ringfeed.shared.corpus.entry import Entry

    lj = replace(Config(), features={"max_frames": 1200})
    ml = replace(load_config(REPO / "configs" / "multilingual.yaml"), features={"max_frames": 400})
    out = []
    for name, cfg, pattern in [
        ("ljspeech-mini", lj, "ljspeech-mini/wavs/*.wav"),
        ("multilingual-demo", ml, "multilingual-demo/clips/*.flac"),
    ]:
        paths = sorted((REPO / "data").glob(pattern))
        clips = ClipReader(cfg)
        out.append((name, cfg, [load_clip(clips, Entry("", str(p), ""), cfg)[0] for p in paths]))
    return out


def _librosa_log_mel(wave, cfg):
    import librosa
    import numpy as np

    from ringfeed.shared.sample.content import LOG_FLOOR

    f = cfg.features
    mel = librosa.feature.melspectrogram(
        y=wave,
        sr=cfg.audio.sample_rate,
        n_fft=f.n_fft,
        hop_length=f.hop_length,
        win_length=f.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
        power=1.0,
        n_mels=f.n_mels,
        fmin=f.fmin,
        fmax=f.fmax,
        htk=False,
        norm="slaney",
    )
    return np.log(np.maximum(mel, LOG_FLOOR)).T


def _batch(cfg, waves):
    """(waves float32 [B, max_samples], lens int32 [B]) as the stager hands TfLogMel."""
    import numpy as np

    arr = np.zeros((len(waves), cfg.max_samples), np.float32)
    for i, w in enumerate(waves):
        arr[i, : len(w)] = w
    return arr, np.array([len(w) for w in waves], np.int32)


def _stager_mel(framework: str, cfg):
    """The stager's batch log-mel in `framework` as the stager builds it, on the CPU; in a
    checkout from before devices.stager_framework, its TensorFlow TfLogMel."""
    import importlib.util

    from ringfeed.shared.config import replace

    if importlib.util.find_spec("ringfeed.consumer.stager.tf_mel") is None:  # before it
        from ringfeed.consumer.stager.gpu_mel import TfLogMel

        return TfLogMel(cfg)
    from ringfeed.consumer.devices import stager_mel_fn

    return stager_mel_fn(
        replace(cfg, features={"device": "stager"}, devices={"stager_framework": framework})
    )


def parity(what: str) -> dict:
    """{corpus: {clips, values, near_floor, <what>[, fft]}} of this checkout, for the
    producers' log_mel ("producer") or the stager's in a framework ("torch", ...)."""
    import numpy as np

    from ringfeed.shared.sample.content import LOG_FLOOR

    out = {}
    for name, cfg, waves in _corpora():
        refs = [_librosa_log_mel(w, cfg) for w in waves]
        row = {
            "clips": len(waves),
            "values": sum(r.size for r in refs),
            "near_floor": sum(int((r < np.log(LOG_FLOOR) + 1.5).sum()) for r in refs),
        }
        if what == "producer":
            from ringfeed.producer.features.fft import fastest
            from ringfeed.producer.features.mel import log_mel

            row["producer"] = max(
                float(np.abs(log_mel(w, cfg) - r).max()) for w, r in zip(waves, refs, strict=True)
            )
            row["fft"] = fastest(cfg.features.n_fft)[0]
        else:
            mel = np.asarray(_stager_mel(what, cfg)(*_batch(cfg, waves))[0])
            row[what] = max(float(np.abs(mel[i, : len(r)] - r).max()) for i, r in enumerate(refs))
        out[name] = row
    return out


def _demo_batch(rows: int):
    """(cfg, waves) of `rows` LJSpeech clips at configs/demo.yaml's features (800 frames),
    the 16 shipped clips in turn, each cut to fit."""
    from ringfeed.producer.audio.decode import load_clip
    from ringfeed.producer.features.mel import fit_length
    from ringfeed.shared.config import load_config, replace
    from ringfeed.shared.corpus.clips import ClipReader
    from ringfeed.shared.corpus.entry import Entry

    cfg = load_config(REPO / "configs" / "demo.yaml")
    cfg = replace(cfg, features={"on_too_long": "truncate"})
    paths = sorted((REPO / "data" / "ljspeech-mini" / "wavs").glob("*.wav"))
    clips = ClipReader(cfg)
    waves = [
        fit_length(load_clip(clips, Entry("", str(p), ""), cfg)[0], cfg)[0]
        for p in paths[: min(rows, len(paths))]
    ]
    return cfg, [waves[i % len(waves)] for i in range(rows)]


def _best_ms(fn) -> float:
    fn()  # warm-up: traces, compiles, plans, buffers
    best = float("inf")
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def cost(what: str, rows: int) -> float:
    """ms of one batch's log-mels by `what` ("producer" or a framework), one thread."""
    cfg, waves = _demo_batch(rows)
    if what == "producer":
        from ringfeed.producer.features.mel import log_mel

        return _best_ms(lambda: [log_mel(w, cfg) for w in waves])
    import numpy as np

    mel_fn, (arr, lens) = _stager_mel(what, cfg), _batch(cfg, waves)
    return _best_ms(lambda: np.asarray(mel_fn(arr, lens)[0]))


def worker(what: str, rows: int) -> None:
    """In a child whose sys.path starts at the checkout measured: print one JSON line.
    what: "parity-<producer or framework>" or "<producer or framework>" (a cost)."""
    from ringfeed.producer.process.threads import pin_math_threads

    pin_math_threads(1)
    framework = what.removeprefix("parity-")
    if framework == "tf":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif framework == "torch":
        import torch

        torch.set_num_threads(1)
    if what.startswith("parity-"):
        print(json.dumps(parity(framework)))
    else:
        print(json.dumps(cost(what, rows)))


def _child(repo: Path, what: str, rows: int = 8):
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        # JAX on one thread, as every variant (XLA's CPU client reads it at its start).
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    }
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "mel_parity.py"), "--worker", what]
        + ["--rows", str(rows)],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> None:
    frameworks = [f for f in args.frameworks.split(",") if f]
    found = _child(REPO, "parity-producer")
    for framework in frameworks:
        for name, row in _child(REPO, f"parity-{framework}").items():
            found[name][framework] = row[framework]
    baseline = Path(args.baseline) if args.baseline else None
    if baseline:
        for name, row in _child(baseline, "parity-tf").items():
            found[name]["tf@baseline"] = row["tf"]
    for name, row in found.items():
        stagers = ", ".join(f"{k} {row[k]:.2g}" for k in [*frameworks, "tf@baseline"] if k in row)
        print(
            f"parity {name}: {row['clips']} clips, {row['values']:,} values "
            f"({row['near_floor']:,} near the floor), max |diff| from librosa: producer "
            f"{row['producer']:.2g} (FFT {row['fft']}); stager {stagers}"
        )
    variants = ["producer", *frameworks] + (["tf@baseline"] if baseline else [])
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            repo = baseline if v.endswith("@baseline") and baseline else REPO
            times[v].append(_child(repo, v.split("@")[0], args.rows))
    med = {v: statistics.median(t) for v, t in times.items()}
    print(
        f"\nbatch of {args.rows} LJSpeech clips, 800 frames, one thread, median of {args.rounds}:"
    )
    for v in variants:
        runs = " / ".join(f"{t:.0f}" for t in times[v])
        name = v if v == "producer" else f"stager {v}"
        print(f"{name:18s} {med[v]:7.1f} ms  ({runs})  {med[v] / med['producer']:.2f}x producer")


def cufft() -> None:
    """rfft + magnitude in float32 against float64 on the GPU (CuPy's cuFFT)."""
    import cupy as cp

    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for rows, frames in [(8, 800), (64, 800)]:
        x = cp.random.RandomState(0).standard_normal((rows, frames, 1024))
        for dtype in ("float32", "float64"):
            xs, window = x.astype(dtype), cp.hanning(1024).astype(dtype)
            fn = lambda xs=xs, w=window: cp.abs(cp.fft.rfft(xs * w, axis=-1)).astype(cp.float32)  # noqa: E731
            fn()
            start, end, ms = cp.cuda.Event(), cp.cuda.Event(), []
            for _ in range(50):
                start.record()
                fn()
                end.record()
                end.synchronize()
                ms.append(cp.cuda.get_elapsed_time(start, end))
            print(f"[{rows}, {frames}, 1024] {dtype}: {statistics.median(ms):.3f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--rows", type=int, default=8, help="clips in the timed batch")
    parser.add_argument(
        "--frameworks", default="torch,jax,tf", help="the stager's, comma-separated"
    )
    parser.add_argument("--baseline", help="a checkout whose TensorFlow stager mel to time too")
    parser.add_argument("--cufft", action="store_true", help="time cuFFT through CuPy only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rows)
    elif args.cufft:
        cufft()
    else:
        main(args)
