"""Training throughput fed by ringfeed, by tf.data, and by nothing (the ideal), side by side.

    .venv/bin/python benchmarks/feed.py [--rounds 3] [--steps 40] [--warmup 5] [--workers 1]

All three train the same model for the same steps: the default model from
``load_model_factory(cfg)`` and the same ``TrainStep`` (XLA per
train.jit_compile) on configs/demo.yaml's data (ljspeech-mini, batch 8,
d_model 64, n_layers 2) at max_frames 600 with on_too_long: truncate (a CPU
step of ~250 ms), with the feature cache off so every sample is really decoded
and turned into a log-mel.
Each variant is its own process with the trainer's TensorFlow thread settings
(``cpu_threads()`` intra-op threads, 1 inter-op thread):

- ideal: a few batches built once from real samples before timing, cycled
  from memory as tf tensors; no input pipeline at all (the limit);
- tfdata: the same per-sample work in the training process:
  ``from_tensor_slices(indices).shuffle.repeat.map(tf.numpy_function(
  SamplePipeline), AUTOTUNE).padded_batch(fixed shapes).prefetch(AUTOTUNE)``;
- ringfeed: a real run, ``python -m ringfeed.scripts.cli stager|producers|trainer
  CONFIG --run-id R``, ``--workers`` producer processes; its numbers come from
  the trainer's run_dir/summary.json.

Every variant times ``warmup + steps`` steps the trainer's way (wait = time
blocked on the next batch; step = until the loss is on the host) and reports
the last ``steps`` only: the first steps trace and compile. For ringfeed that
is train.steps = warmup + steps; the trainer leaves only its compiling step out
of summary.json, and its step-time CV is over its last CV_WINDOW_STEPS (50,
consumer/trainer/metrics.py) steps, so warm-up steps count when steps < 50.
Step time is the mean over those steps (summary.json has no per-step times);
samples/s is samples over (step + wait) time; wait is wait time over (step +
wait) time.

The rounds alternate the variants so machine noise hits them alike; the table
gives the median over rounds and the ratios. On a CPU-only host the train step
and the producers (or tf.data's map threads) share the same cores, so the
producers' "capacity" is whatever the step leaves them; on a GPU host the step
runs on the device and the host cores are the producers' alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.shared.config import Config, load_config, read_raw  # noqa: E402

VARIANTS = ("ideal", "tfdata", "ringfeed")
# Distinct batches the ideal variant cycles through (built from real samples).
IDEAL_BATCHES = 4
# Longest one variant's process may run, seconds (TF import + XLA compile on 2 cores).
RUN_TIMEOUT_S = 300.0
# Prefix of the one stdout line a runner child writes its result on.
RESULT_TAG = "FEED_RESULT "


def bench_config(raw: dict[str, Any], root: Path, workers: int, warmup: int, steps: int) -> dict:
    """demo.yaml's raw config with the benchmark's overrides; root is the run_root."""
    raw = json.loads(json.dumps(raw))  # deep copy
    raw.setdefault("features", {}).update({"cache": False, "on_too_long": "truncate"})
    raw.setdefault("producers", {})["workers"] = workers
    # Ours is the only consumer and a finished trainer ends the run: no epoch limit.
    raw.setdefault("stager", {})["epochs"] = 0
    total = warmup + steps
    # No checkpoint or log inside the timed loop; the window is exactly the last `steps`.
    raw["train"] = raw.get("train", {}) | {
        "steps": total,
        "log_every": total,
        "checkpoint_every": total,
        "log_batches": False,
    }
    raw["run_root"] = str(root)
    return raw


# ---------------------------------------------------------------- runner child (ideal, tfdata)


def _sample_arrays(pipe: Any, entry: Any) -> tuple[np.ndarray, np.ndarray]:
    sample = pipe(entry)
    return sample.tokens.astype(np.int32), sample.mel.astype(np.float32)


def ideal_batches(cfg: Config, entries: list, pipe: Any) -> list[dict[str, Any]]:
    """IDEAL_BATCHES batches as cfg.batch_fields() from real samples, as tf tensors."""
    import tensorflow as tf

    fields = cfg.batch_fields()
    b = cfg.stager.batch_size
    batches = []
    for k in range(IDEAL_BATCHES):
        arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in fields.items()}
        for row in range(b):
            i = (k * b + row) % len(entries)
            tokens, mel = _sample_arrays(pipe, entries[i])
            arrays["tokens"][row, : len(tokens)] = tokens
            arrays["mel"][row, : len(mel)] = mel
            arrays["text_lens"][row], arrays["mel_lens"][row] = len(tokens), len(mel)
            arrays["items"][row] = i
        batches.append({name: tf.constant(a) for name, a in arrays.items()})
    return batches


def tf_dataset(cfg: Config, entries: list, pipe: Any):
    """The tf.data input pipeline doing the producers' per-sample work in this process."""
    import tensorflow as tf

    from ringfeed.producer.sample import SkipSample

    f = cfg.features

    def load(i: np.int64) -> tuple[np.ndarray, np.ndarray, np.int32, np.int32]:
        try:
            tokens, mel = _sample_arrays(pipe, entries[int(i)])
        except SkipSample:
            # A skipped sample becomes an empty one, which the filter below drops.
            tokens, mel = np.zeros(0, np.int32), np.zeros((0, f.n_mels), np.float32)
        return tokens, mel, np.int32(len(tokens)), np.int32(len(mel))

    def to_dict(i: tf.Tensor) -> dict[str, tf.Tensor]:
        out = (tf.int32, tf.float32, tf.int32, tf.int32)
        tokens, mel, text_len, mel_len = tf.numpy_function(load, [i], out, stateful=False)
        tokens.set_shape([None])
        mel.set_shape([None, f.n_mels])
        text_len.set_shape([])
        mel_len.set_shape([])
        ids = {"speaker": 0, "language": 0}  # one speaker: the default model takes the ids
        return {"tokens": tokens, "text_lens": text_len, "mel": mel, "mel_lens": mel_len} | ids

    padded = {
        "tokens": [cfg.text.max_text_len],
        "text_lens": [],
        "mel": [f.max_frames, f.n_mels],
        "mel_lens": [],
        "speaker": [],
        "language": [],
    }
    return (
        tf.data.Dataset.from_tensor_slices(np.arange(len(entries), dtype=np.int64))
        .shuffle(len(entries), seed=cfg.stager.seed, reshuffle_each_iteration=True)
        .repeat()
        .map(to_dict, num_parallel_calls=tf.data.AUTOTUNE)
        .filter(lambda x: x["mel_lens"] > 0)
        .padded_batch(cfg.stager.batch_size, padded_shapes=padded, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def run_variant(variant: str, cfg: Config, warmup: int) -> dict[str, Any]:
    """Train in this process fed by `variant` ("ideal" or "tfdata"); the trainer's numbers."""
    from ringfeed.consumer.trainer.trainer import build_step

    _, _, _, _, step_fn = build_step(cfg)  # the device first, then TensorFlow

    from ringfeed.consumer.trainer.metrics import StepMetrics
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.shared.corpus.open import read_corpus

    entries, _ = read_corpus(cfg)
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    if variant == "ideal":
        fixed = ideal_batches(cfg, entries, pipe)
        batches = (fixed[k % len(fixed)] for k in range(10**9))
    else:
        batches = iter(tf_dataset(cfg, entries, pipe))
    metrics = StepMetrics(window=cfg.train.steps)  # every timed step
    step_times: list[float] = []
    for k in range(cfg.train.steps):
        t0 = time.perf_counter()
        batch = next(batches)
        wait_s = time.perf_counter() - t0
        float(step_fn(batch))  # float() waits for the step: true step time
        step_s = time.perf_counter() - t0 - wait_s
        if k >= warmup:
            metrics.record(step_s, wait_s, cfg.stager.batch_size)
            step_times.append(step_s)
    m = metrics.summary()
    return {
        "samples_per_s": m["samples_per_s"],
        "step_time_s": m["step_time_s"],
        "step_time_median_s": statistics.median(step_times),
        "data_wait_fraction": m["wait_frac"],
        "step_time_cv": m["step_time_cv"],
        "steps": cfg.train.steps,
    }


def spawn_variant(variant: str, cfg_path: Path, warmup: int) -> dict[str, Any]:
    """Run one variant in a child `python benchmarks/feed.py --variant V` process."""
    cmd = [sys.executable, __file__, "--variant", variant, "--config", str(cfg_path)]
    cmd += ["--warmup", str(warmup)]
    done = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"{variant} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


# ---------------------------------------------------------------- ringfeed (a real run)


def run_ringfeed(cfg_path: Path, root: Path, tmp: Path) -> dict[str, Any]:
    """Stager, producers and trainer as real processes; the trainer's summary.json."""
    from ringfeed.scripts.runner import Run

    run_id = f"feed-{uuid.uuid4().hex[:6]}"
    with Run(cfg_path, run_id, log_dir=tmp) as run:
        run.start_all("trainer")
        code = run.wait("trainer", RUN_TIMEOUT_S)
        run.wait_all(30)
        summary = run.dir / "summary.json"
        if code != 0 or not summary.exists():
            raise RuntimeError(f"ringfeed run {run_id} failed (trainer exit {code}):\n{run.logs()}")
        return json.loads(summary.read_text())


# ---------------------------------------------------------------- driver


def print_table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    def med(variant: str, key: str) -> float | None:
        values = [r[key] for r in results[variant] if r.get(key) is not None]
        return statistics.median(values) if values else None

    print(
        f"\nmedian of {args.rounds} rounds; {args.steps} steps after {args.warmup} warm-up, "
        f"batch {args.batch}, {args.workers} producer worker(s), {os.cpu_count()} CPUs"
    )
    print(f"{'':9s} {'samples/s':>9s} {'step ms':>8s} {'med ms':>7s} {'wait':>6s} {'cv':>5s}")
    for v in results:
        per_step = med(v, "step_time_median_s")
        print(
            f"{v:9s} {med(v, 'samples_per_s'):9.1f} {med(v, 'step_time_s') * 1e3:8.1f} "
            + (f"{per_step * 1e3:7.1f}" if per_step is not None else f"{'-':>7s}")
            + f" {med(v, 'data_wait_fraction'):6.1%} {med(v, 'step_time_cv'):5.0%}"
        )
    rate = {v: med(v, "samples_per_s") for v in results}
    if "ringfeed" in rate:
        for other in ("ideal", "tfdata"):
            if other in rate:
                print(f"ringfeed / {other:6s} = {rate['ringfeed'] / rate[other]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps (compile)")
    parser.add_argument("--workers", type=int, default=1, help="ringfeed producer processes")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-frames", type=int, default=600)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", choices=("ideal", "tfdata"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a runner child: one variant, one JSON line
        result = run_variant(args.variant, load_config(args.config), args.warmup)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return
    variants = [v for v in args.variants.split(",") if v]
    raw = read_raw(REPO / "configs" / "demo.yaml")
    raw.setdefault("stager", {})["batch_size"] = args.batch
    raw.setdefault("features", {})["max_frames"] = args.max_frames
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="feed-bench-") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "runs"
        cfg_path = tmp / "feed.yaml"
        cfg_raw = bench_config(raw, root, args.workers, args.warmup, args.steps)
        cfg_path.write_text(yaml.safe_dump(cfg_raw, sort_keys=False))
        load_config(cfg_path)  # fail here, not in a child, on a bad config
        for r in range(args.rounds):
            for v in variants:
                t0 = time.perf_counter()
                if v == "ringfeed":
                    out = run_ringfeed(cfg_path, root, tmp)
                else:
                    out = spawn_variant(v, cfg_path, args.warmup)
                results[v].append(out)
                print(
                    f"round {r + 1} {v:8s} {out['samples_per_s']:6.1f} samples/s "
                    f"step {out['step_time_s'] * 1e3:6.1f} ms "
                    f"wait {out['data_wait_fraction']:5.1%} "
                    f"({time.perf_counter() - t0:.0f} s wall)",
                    flush=True,
                )
    print_table(results, args)


if __name__ == "__main__":
    main()
