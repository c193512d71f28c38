"""Length buckets against one fixed shape, and against tf.data's bucket_by_sequence_length.

    .venv/bin/python benchmarks/buckets.py [--rounds 2] [--steps 30] [--data shipped,ljspeech]
    .venv/bin/python benchmarks/buckets.py --lengths 13100    # time the length table
    .venv/bin/python benchmarks/buckets.py --data shipped --rounds 1 --steps 5 --plot PNG

The demo model (d_model 64, 2 layers, XLA) trained for `--steps` steps by
each variant, on two datasets:

- shipped: the 16 clips in data/ljspeech-mini (max_frames 800, truncate),
  real per-sample work (decode, resample, log-mel; feature cache off);
- ljspeech: 4,000 synthetic items with LJSpeech's clip-length shape
  (data.synthetic_lengths: ljspeech, 1..10 s, mean ~6.6 s, over max_frames 800).

Variants, each its own process(es):

- fixed: a ringfeed run with one shape [8, 800] (stager.buckets unset);
- buckets: a ringfeed run with stager.auto_buckets: 4 and the default frame
  budget (8 x 800 frames per batch, so no batch is larger than fixed's);
- tfdata: the same per-sample work in the training process through
  ``tf.data ... .bucket_by_sequence_length(pad_to_bucket_boundary=True)`` with
  the same bucket lengths and batch sizes as the buckets run chose, tokens
  padded to text.max_text_len (tf.data pads every component by one rule).

Reported per variant (median over rounds): padding efficiency (true / padded
mel frames, and tokens), useful mel frames per second (true frames over step
+ wait time), samples/s, step-time CV, compilations (trace count), and the
largest batch in bytes. Steps that compiled are outside every timing (the
trainer's rule). Rounds alternate the variants so machine noise hits them alike.
``--plot PATH`` draws each dataset's useful mel frames per second and padding
efficiency (benchmarks/charts.py) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
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
from charts import draw_bars, run_label

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.shared.config import Config, load_config, read_raw  # noqa: E402

RUN_TIMEOUT_S = 600.0
RESULT_TAG = "BUCKETS_RESULT "
DATASETS = {
    "shipped": {"data": {"path": str(REPO / "data" / "ljspeech-mini")}},
    "ljspeech": {
        "data": {"format": "synthetic", "synthetic_items": 4000, "synthetic_lengths": "ljspeech"}
    },
}


def bench_config(dataset: str, variant: str, root: Path, steps: int) -> dict[str, Any]:
    raw = read_raw(REPO / "configs" / "demo.yaml")
    raw = {**raw, **json.loads(json.dumps(DATASETS[dataset]))}
    raw["features"] = raw.get("features", {}) | {
        "cache": False,
        "on_too_long": "truncate",
        "max_frames": 800,
        "cache_dir": str(root / "cache"),
    }
    raw["stager"] = {"batch_size": 8, "epochs": 0, "batch_slots": 3}
    if variant != "fixed":
        raw["stager"]["auto_buckets"] = 4
    raw["model"] = raw.get("model", {}) | {"kwargs": {"d_model": 64, "n_layers": 2}}
    raw["producers"] = {"workers": 1}
    raw["train"] = raw.get("train", {}) | {
        "steps": steps,
        "log_every": steps,
        "checkpoint_every": steps,
        "jit_compile": True,
    }
    raw["run_root"] = str(root / "runs")
    return raw


def batch_bytes(cfg: Config, shapes: list[list[int]]) -> int:
    """Bytes of the largest batch: mel float32 + tokens int32 + per-row lengths and ids."""
    n_mels = cfg.features.n_mels
    return max(rows * (frames * n_mels * 4 + text * 4 + 16) for rows, frames, text in shapes)


# ---------------------------------------------------------------- ringfeed (real runs)


def run_ringfeed(cfg_path: Path, tmp: Path) -> dict[str, Any]:
    from ringfeed.scripts.runner import Run

    cfg = load_config(cfg_path)
    run_id = f"bk-{uuid.uuid4().hex[:6]}"
    with Run(cfg_path, run_id, log_dir=tmp) as run:
        run.start_all("trainer")
        code = run.wait("trainer", RUN_TIMEOUT_S)
        run.wait_all(30)
        if code != 0:
            raise RuntimeError(f"ringfeed run {run_id} failed (exit {code}):\n{run.logs()}")
        summary, stager = run.json("summary.json"), run.json("stager.json")
    shapes = stager["buckets"] or [
        [cfg.stager.batch_size, cfg.features.max_frames, cfg.text.max_text_len]
    ]
    return {
        "pad_frames": summary["padding_efficiency_frames"],
        "pad_text": summary["padding_efficiency_text"],
        "useful_frames_per_s": summary["useful_frames_per_s"],
        "samples_per_s": summary["samples_per_s"],
        "step_time_cv": summary["step_time_cv"],
        "compiles": summary["trace_count"],
        "batch_mib": batch_bytes(cfg, shapes) / 2**20,
        "shapes": shapes,
    }


# ---------------------------------------------------------------- tf.data (child process)


def tf_bucketed(cfg: Config, shapes: list[list[int]]):
    """tf.data doing the producers' per-sample work here, bucketed by mel length."""
    import tensorflow as tf

    from ringfeed.producer.sample import SkipSample
    from ringfeed.producer.sources import make_source

    source = make_source(cfg)
    source.warm_up()
    n_mels, t_max = cfg.features.n_mels, cfg.text.max_text_len

    def load(i: np.int64) -> tuple[np.ndarray, np.ndarray, np.int32, np.int32, np.int64]:
        try:
            s = source.prepare(int(i))
            tokens, mel = s.tokens.astype(np.int32), s.mel.astype(np.float32)
        except SkipSample:
            tokens, mel = np.zeros(0, np.int32), np.zeros((0, n_mels), np.float32)
        return tokens, mel, np.int32(len(tokens)), np.int32(len(mel)), np.int64(i)

    def to_dict(i: tf.Tensor) -> dict[str, tf.Tensor]:
        out = (tf.int32, tf.float32, tf.int32, tf.int32, tf.int64)
        tokens, mel, text_len, mel_len, item = tf.numpy_function(load, [i], out, stateful=False)
        tokens.set_shape([None])
        mel.set_shape([None, n_mels])
        text_len.set_shape([]), mel_len.set_shape([]), item.set_shape([])
        return {
            "tokens": tokens,
            "text_lens": text_len,
            "mel": mel,
            "mel_lens": mel_len,
            "items": item,
            "speaker": 0,
            "language": 0,
        }

    lengths = [frames for _, frames, _ in shapes]
    padded = {
        "tokens": [t_max],
        "text_lens": [],
        "mel": [None, n_mels],
        "mel_lens": [],
        "items": [],
        "speaker": [],
        "language": [],
    }
    return (
        tf.data.Dataset.from_tensor_slices(np.arange(source.n_items, dtype=np.int64))
        .shuffle(source.n_items, seed=cfg.stager.seed, reshuffle_each_iteration=True)
        .repeat()
        .map(to_dict, num_parallel_calls=tf.data.AUTOTUNE)
        .filter(lambda x: x["mel_lens"] > 0)
        .bucket_by_sequence_length(
            lambda x: x["mel_lens"],
            bucket_boundaries=[n + 1 for n in lengths],
            bucket_batch_sizes=[rows for rows, _, _ in shapes] + [1],
            padded_shapes=padded,
            pad_to_bucket_boundary=True,
            drop_remainder=True,
        )
        .prefetch(tf.data.AUTOTUNE)
    )


def run_tfdata(cfg: Config, shapes: list[list[int]]) -> dict[str, Any]:
    from ringfeed.consumer.trainer.trainer import build_step

    _, _, _, _, step_fn = build_step(cfg)  # the device first, then TensorFlow
    from ringfeed.consumer.trainer.metrics import StepMetrics

    batches = iter(tf_bucketed(cfg, shapes))
    metrics, seen = StepMetrics(cfg.train.steps), set()
    for _ in range(cfg.train.steps):
        t0 = time.perf_counter()
        batch = next(batches)
        wait_s = time.perf_counter() - t0
        traces = step_fn.trace_count
        float(step_fn(batch))
        step_s = time.perf_counter() - t0 - wait_s
        mel_lens, text_lens = batch["mel_lens"].numpy(), batch["text_lens"].numpy()
        rows, frames = batch["mel"].shape[:2]
        seen.add((rows, frames, batch["tokens"].shape[1]))
        metrics.fill(
            (
                int(mel_lens.sum()),
                rows * frames,
                int(text_lens.sum()),
                int(np.prod(batch["tokens"].shape)),
            )
        )
        if step_fn.trace_count == traces:
            metrics.record(step_s, wait_s, rows, int(mel_lens.sum()))
    m = metrics.run_summary()
    return {
        "pad_frames": m["padding_efficiency_frames"],
        "pad_text": m["padding_efficiency_text"],
        "useful_frames_per_s": m["useful_frames_per_s"],
        "samples_per_s": m["samples_per_s"],
        "step_time_cv": m["step_time_cv"],
        "compiles": step_fn.trace_count,
        "batch_mib": batch_bytes(cfg, [list(s) for s in seen]) / 2**20,
        "shapes": sorted(seen),
    }


def spawn_tfdata(cfg_path: Path, shapes: list[list[int]]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(cfg_path), "--shapes", json.dumps(shapes)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"tfdata failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


# ---------------------------------------------------------------- length table


def time_lengths(n_items: int, tmp: Path) -> None:
    """Build the length table of an LJSpeech-size dataset: n_items entries over the
    shipped clips (hard links, so every entry is its own file), cold then current."""
    from ringfeed.producer.prepare.lengths import measure_lengths
    from ringfeed.shared.config import config_from_dict
    from ringfeed.shared.corpus.open import open_corpus

    shipped = REPO / "data" / "ljspeech-mini"
    lines = (shipped / "metadata.csv").read_text().splitlines()
    data = tmp / "lengths-data"
    (data / "wavs").mkdir(parents=True)
    out = []
    for i in range(n_items):
        item_id, *rest = lines[i % len(lines)].split("|")
        (data / "wavs" / f"x{i:05d}.wav").hardlink_to(shipped / "wavs" / f"{item_id}.wav")
        out.append("|".join([f"x{i:05d}", *rest]))
    (data / "metadata.csv").write_text("\n".join(out) + "\n")
    cfg = config_from_dict(
        {
            "data": {"path": str(data)},
            "stager": {"auto_buckets": 4},
            "features": {"cache_dir": str(tmp / "lengths-cache")},
        }
    )
    for what in ("cold", "current"):
        t0 = time.perf_counter()
        measure_lengths(cfg, open_corpus(cfg))
        print(f"length table of {n_items} items, {what}: {time.perf_counter() - t0:.2f} s")


# ---------------------------------------------------------------- driver


def print_table(dataset: str, results: dict[str, list[dict]], rounds: int) -> None:
    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in results[variant])

    print(f"\n{dataset}: median of {rounds} round(s)")
    print(
        f"{'':9s} {'pad mel':>8s} {'pad text':>8s} {'frames/s':>9s} {'samples/s':>9s} "
        f"{'cv':>5s} {'compiles':>8s} {'batch MiB':>9s}"
    )
    for v in results:
        print(
            f"{v:9s} {med(v, 'pad_frames'):8.3f} {med(v, 'pad_text'):8.3f} "
            f"{med(v, 'useful_frames_per_s'):9.0f} {med(v, 'samples_per_s'):9.1f} "
            f"{med(v, 'step_time_cv'):5.0%} {med(v, 'compiles'):8.0f} {med(v, 'batch_mib'):9.2f}"
        )
    fps = {v: med(v, "useful_frames_per_s") for v in results}
    for other in ("fixed", "tfdata"):
        print(f"buckets / {other:6s} useful frames/s = {fps['buckets'] / fps[other]:.2f}x")
    print(f"bucket shapes (rows, frames, text): {results['buckets'][0]['shapes']}")


def plot(by_dataset: dict[str, dict[str, list[dict]]], path: str) -> None:
    """Per dataset, each variant's median useful mel frames per second and padding
    efficiency (true / padded mel frames)."""

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    names = {"fixed": "ringfeed fixed", "buckets": "ringfeed buckets", "tfdata": "tf.data"}
    panels = []
    for dataset, results in by_dataset.items():
        for key, what in (
            ("useful_frames_per_s", "useful mel frames/s"),
            ("pad_frames", "padding efficiency"),
        ):
            panels.append(
                (f"{dataset}: {what}", {names[v]: med(rows, key) for v, rows in results.items()})
            )
    title = "Length buckets against one shape and tf.data's bucketing (median)"
    draw_bars(path, title, panels, run_label("buckets.py"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--data", default="shipped,ljspeech")
    parser.add_argument("--lengths", type=int, default=0, help="only time the length table of N")
    parser.add_argument("--plot", help="also draw the medians into this PNG")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_tfdata(load_config(args.child), json.loads(args.shapes))
        print(RESULT_TAG + json.dumps(result, default=list))
        return
    with tempfile.TemporaryDirectory(prefix="ringfeed-buckets-") as tmp_name:
        tmp = Path(tmp_name)
        if args.lengths:
            time_lengths(args.lengths, tmp)
            return
        by_dataset = {}
        for dataset in args.data.split(","):
            results: dict[str, list[dict]] = {"fixed": [], "buckets": [], "tfdata": []}
            by_dataset[dataset] = results
            paths = {}
            for variant in ("fixed", "buckets"):
                raw = bench_config(dataset, variant, tmp, args.steps)
                paths[variant] = tmp / f"{dataset}-{variant}.yaml"
                paths[variant].write_text(yaml.safe_dump(raw))
            for r in range(args.rounds):
                for variant in ("fixed", "buckets", "tfdata"):
                    if variant == "tfdata":
                        shapes = results["buckets"][-1]["shapes"]
                        result = spawn_tfdata(paths["buckets"], shapes)
                    else:
                        result = run_ringfeed(paths[variant], tmp)
                    results[variant].append(result)
                    print(
                        f"{dataset} round {r + 1} {variant}: "
                        f"{json.dumps({k: v for k, v in result.items() if k != 'shapes'})}",
                        flush=True,
                    )
            print_table(dataset, results, args.rounds)
        if args.plot:
            plot(by_dataset, args.plot)


if __name__ == "__main__":
    main()
