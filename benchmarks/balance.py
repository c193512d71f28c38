"""Balanced epochs: padding, useful frames per second, window ratios and plan cost.

    .venv/bin/python benchmarks/balance.py [--items 200000] [--rounds 2] [--steps 30]
    .venv/bin/python benchmarks/balance.py --build 10000000 [--speakers 50000]   # plan cost
    .venv/bin/python benchmarks/balance.py --items 20000 --rounds 1 --steps 5 --plot PNG
    .venv/bin/python benchmarks/balance.py --upsampled [--items 2000] [--corpora 4] [--epochs 3]

On the generated lopsided corpus (tests/support/lopsided.py: languages 80 / 15 / 5 %,
Zipf-sized speakers, the rare language speaking longer clips), three plans:

- balanced+buckets: stager.balance by language, temperature 0.3, four length
  buckets (200 / 300 / 450 / 800 frames, 8 x 800 frames a batch);
- plain+buckets: the same buckets without balance (BucketBatches of a Shuffle);
- balanced, no buckets: one fixed shape [8, 800].

For each: padding efficiency (true / padded mel frames over every batch of an
epoch, empty rows of part-filled batches counted as padding), the worst gap
between a language's share of any 10 consecutive batches and its target share
(the data's for plain+buckets), and the useful mel frames per second of the demo
model (d_model 64, 2 layers, XLA, CPU) training on the plan's first batches (true
frames over step time; each shape compiled before timing; rounds alternate the
plans). --build times the balanced plan of one epoch at that many items (and the
plain bucketed plan's dealing beside it, rounds alternating) and its memory: the
peak resident memory the build adds (VmHWM, reset before each) and the arrays the
plan keeps (kept_epochs of them), in bytes per item. ``--plot PATH`` draws the comparison
(benchmarks/charts.py) for docs/benchmarks.md.

--upsampled: the padding of a small corpus whose small group is drawn several times an
epoch (issue 49's held-out runs): the same generated corpus at 2,000 clips (its rare
language's 100 clips drawn 4.3 times at temperature 0.3, 6.7 times at 0), four
auto_buckets as the stager fits them (to the epoch as drawn for the balanced plan, to
the corpus for the plain one: consumer/stager/plan/make.py) and 32 rows of 800 frames a
batch; each plan's padding efficiency side by side at temperatures 0, 0.3 and 1, the
mean over --corpora generated corpora (seeds 0, 1, ...) and --epochs epochs of each, and
the worst gap among them. No model: a few seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from charts import draw_bars, run_label

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.consumer.stager.plan.balance import (  # noqa: E402
    BalancedBatches,
    Groups,
    group_weights,
    quotas,
)
from ringfeed.consumer.stager.plan.buckets import Bucket, BucketBatches  # noqa: E402
from ringfeed.consumer.stager.plan.layout import kept_epochs  # noqa: E402
from ringfeed.consumer.stager.plan.plan import Plan  # noqa: E402
from ringfeed.consumer.stager.plan.shuffle import Shuffle  # noqa: E402
from tests.support.lopsided import Corpus, lopsided_corpus  # noqa: E402

SEED = 1234
TEMPERATURE = 0.3
BATCH_FRAMES = 8 * 800
WINDOW_BATCHES = 10
# --upsampled: rows of the longest bucket's batch (32 x 800 frames a batch, the held-out run's)
UPSAMPLED_ROWS = 32


def plans(corpus: Corpus) -> dict[str, Plan]:
    groups = corpus.languages
    weights = group_weights(groups.sizes, TEMPERATURE, [1.0] * len(groups.names))
    n = len(corpus.frames)
    fixed = [Bucket(800, corpus.buckets[-1].text, BATCH_FRAMES // 800)]
    plain = BucketBatches(Shuffle(n, SEED), corpus.buckets, corpus.of_bucket, corpus.text)
    return {
        "balanced+buckets": Plan(
            BalancedBatches(SEED, corpus.buckets, corpus.of_bucket, groups, weights, corpus.text),
            epochs=1,
        ),
        "plain+buckets": Plan(plain, epochs=1),
        "balanced, no buckets": Plan(
            BalancedBatches(SEED, fixed, np.zeros(n, np.int32), groups, weights, corpus.text),
            epochs=1,
        ),
    }


def epoch_batches(plan: Plan, corpus: Corpus, epoch: int = 0) -> list[tuple[Bucket, np.ndarray]]:
    layout = plan.layout(epoch)
    ends = np.append(layout.starts, len(layout.order))
    return [
        (plan.buckets[int(b)], layout.order[ends[k] : ends[k + 1]])
        for k, b in enumerate(layout.buckets)
    ]


def padding(batches: list[tuple[Bucket, np.ndarray]], corpus: Corpus) -> float:
    true = sum(int(np.minimum(corpus.frames[items], b.frames).sum()) for b, items in batches)
    return true / sum(b.rows * b.frames for b, _ in batches)


def worst_window(plan: Plan, corpus: Corpus, balanced: bool) -> float:
    layout = plan.layout(0)
    groups = corpus.languages
    if balanced:
        w = group_weights(groups.sizes, TEMPERATURE, [1.0] * len(groups.names))
        q = quotas(w, len(corpus.frames), SEED, 0)
    else:
        q = groups.sizes
    target = q / q.sum()
    group = groups.of_item[layout.order]
    ends = np.append(layout.starts, len(layout.order))
    full = len(layout.starts) - len(plan.buckets)  # the epoch's last, part-filled ones
    worst = 0.0
    for i in range(max(0, full - WINDOW_BATCHES)):
        window = np.bincount(group[ends[i] : ends[i + WINDOW_BATCHES]], minlength=len(q))
        worst = max(worst, float(np.abs(window / window.sum() - target).max()))
    return worst


def model_step(n_shapes: int):
    """The demo model's TrainStep on CPU (XLA), and the config it was built from."""
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from ringfeed.consumer.devices import configure_tensorflow, plan_device
    from ringfeed.consumer.trainer import model as model_module
    from ringfeed.consumer.trainer.train_step import TrainStep, make_optimizer
    from ringfeed.shared.config import config_from_dict

    cfg = config_from_dict(
        {
            "stager": {"batch_size": 8, "buckets": [200, 300, 450, 800][-n_shapes:]},
            "model": {"kwargs": {"d_model": 64, "n_layers": 2}},
            "train": {"mixed_precision": False},
        }
    )
    configure_tensorflow(plan_device("trainer", cfg, 0))
    model, loss_fn = model_module.load_model_factory(cfg)
    return cfg, TrainStep(model, make_optimizer(cfg), loss_fn, True, max_shapes=4)


def tensors(cfg, bucket: Bucket, items: np.ndarray, corpus: Corpus, rng) -> dict:
    rows = bucket.rows
    mel_lens = np.zeros(rows, np.int32)
    text_lens = np.zeros(rows, np.int32)
    mel_lens[: len(items)] = np.minimum(corpus.frames[items], bucket.frames)
    text_lens[: len(items)] = np.minimum(corpus.text[items], bucket.text)
    return {
        "tokens": rng.integers(1, cfg.vocab_size, (rows, bucket.text)).astype(np.int32),
        "text_lens": text_lens,
        "mel": rng.normal(size=(rows, bucket.frames, cfg.features.n_mels)).astype(np.float32),
        "mel_lens": mel_lens,
        "speaker": np.zeros(rows, np.int32),
        "language": np.zeros(rows, np.int32),
    }


def useful_frames_per_s(step, cfg, batches, corpus: Corpus, steps: int) -> float:
    rng = np.random.default_rng(0)
    chosen = batches[:steps]
    data = [tensors(cfg, b, items, corpus, rng) for b, items in chosen]
    for shape in {b.frames: k for k, (b, _) in enumerate(chosen)}.values():
        float(step(data[shape]))  # compile every shape first: outside the timing
    t0 = time.perf_counter()
    for batch in data:
        float(step(batch))
    elapsed = time.perf_counter() - t0
    return sum(int(b["mel_lens"].sum()) for b in data) / elapsed


def compare(items: int, rounds: int, steps: int, plot_path: str | None) -> None:
    corpus = lopsided_corpus(items, batch_frames=BATCH_FRAMES)
    found = plans(corpus)
    batches = {name: epoch_batches(plan, corpus) for name, plan in found.items()}
    cfg, step = model_step(4)
    rates: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(rounds):
        for name in found:
            rates[name].append(useful_frames_per_s(step, cfg, batches[name], corpus, steps))
    print(f"{items} items, temperature {TEMPERATURE} by language, {rounds} rounds x {steps} steps")
    print("| plan | batches | padding eff. | worst 10-batch share gap | useful mel frames/s |")
    print("|---|---:|---:|---:|---:|")
    pads, gaps, frames = {}, {}, {}
    for name, plan in found.items():
        gaps[name] = worst_window(plan, corpus, balanced=name.startswith("balanced"))
        pads[name] = padding(batches[name], corpus)
        frames[name] = statistics.median(rates[name])
        rounds_shown = " / ".join(f"{r:,.0f}" for r in rates[name])
        print(
            f"| {name} | {len(batches[name])} | {pads[name]:.3f} | "
            f"{gaps[name]:.3f} | {frames[name]:,.0f} ({rounds_shown}) |"
        )
    if plot_path:
        panels = [
            ("padding efficiency", pads),
            ("worst 10-batch share gap", gaps),
            ("useful mel frames/s (median)", frames),
        ]
        draw_bars(
            plot_path,
            f"Balanced epochs on {items:,} lopsided clips",
            panels,
            run_label("balance.py"),
            ours=["balanced+buckets"],
        )


def upsampled(items: int, corpora: int, epochs: int) -> None:
    """--upsampled: balanced against plain buckets' padding, side by side (docstring)."""
    from ringfeed.consumer.stager.plan.balance import drawn
    from ringfeed.consumer.stager.plan.buckets import make_buckets
    from ringfeed.shared.config import config_from_dict
    from ringfeed.shared.corpus.lengths import Lengths

    cfg = config_from_dict({"stager": {"auto_buckets": 4, "batch_size": UPSAMPLED_ROWS}})
    rows: dict[float, list[tuple[float, float]]] = {0.0: [], 0.3: [], 1.0: []}
    for seed in range(corpora):
        corpus = lopsided_corpus(items, seed)
        table, groups = Lengths(corpus.frames, corpus.text), corpus.languages
        buckets, of_bucket = make_buckets(cfg, table)
        plain = Plan(BucketBatches(Shuffle(items, SEED), buckets, of_bucket, corpus.text))
        for temperature, found in rows.items():
            weights = group_weights(groups.sizes, temperature, [1.0] * len(groups.names))
            fitted, of_fitted = make_buckets(cfg, table, drawn(groups, weights))
            balanced = Plan(BalancedBatches(SEED, fitted, of_fitted, groups, weights, corpus.text))
            found += [
                (
                    padding(epoch_batches(plain, corpus, e), corpus),
                    padding(epoch_batches(balanced, corpus, e), corpus),
                )
                for e in range(epochs)
            ]
    sizes = lopsided_corpus(items).languages.sizes
    print(
        f"{items} clips by language ({', '.join(map(str, sizes))}), four auto_buckets, "
        f"{UPSAMPLED_ROWS} rows of {cfg.features.max_frames} frames a batch; corpora 0-"
        f"{corpora - 1} x epochs 0-{epochs - 1}"
    )
    print("| temperature | rare language drawn | plain buckets | balanced | gap (worst) |")
    print("|---:|---:|---:|---:|---:|")
    for temperature, found in rows.items():
        weights = group_weights(sizes, temperature, [1.0, 1.0, 1.0])
        times = quotas(weights, items, SEED, 0)[-1] / sizes[-1]
        theirs, ours = (statistics.mean(x) for x in zip(*found, strict=True))
        worst = max(p - b for p, b in found)
        print(
            f"| {temperature:g} | {times:.1f}x | {theirs:.3f} | {ours:.3f} | "
            f"{theirs - ours:.3f} ({worst:.3f}) |"
        )


def many_speakers(items: int, k: int) -> Groups:
    """k speakers of Zipf-like sizes (exponent 1.1) over `items` clips."""
    zipf = 1.0 / np.arange(1, k + 1) ** 1.1
    of_item = np.random.default_rng(0).choice(k, size=items, p=zipf / zipf.sum())
    return Groups(of_item.astype(np.int32), tuple(f"s{i}" for i in range(k)))


def build(items: int, rounds: int, speakers: int) -> None:
    corpus = lopsided_corpus(items, batch_frames=BATCH_FRAMES)
    cases = [("language", corpus.languages), ("speaker", corpus.speakers)]
    if speakers:
        cases.append(("speaker", many_speakers(items, speakers)))
    plain = BucketBatches(Shuffle(items, SEED), corpus.buckets, corpus.of_bucket, corpus.text)
    results: dict[str, list[tuple[float, float, float]]] = {}
    for epoch in range(rounds + 1):  # round 0 loads numba's compiled code: not counted
        for by, groups in cases:
            weights = group_weights(groups.sizes, TEMPERATURE, [1.0] * len(groups.names))
            part = BalancedBatches(
                SEED, corpus.buckets, corpus.of_bucket, groups, weights, corpus.text
            )
            measured = measure(part, epoch, items)
            if epoch:
                results.setdefault(f"balanced by {by} ({len(groups.names)} groups)", []).append(
                    measured
                )
        if epoch:
            results.setdefault("plain buckets (BucketBatches)", []).append(
                measure(plain, epoch, items)
            )
    for name, runs in results.items():
        each = ", ".join(f"{t:.2f}" for t, _, _ in runs)
        print(
            f"{name}, {items:,} items: build {statistics.median(t for t, _, _ in runs):.2f} s "
            f"(each: {each}), peak {max(p for _, p, _ in runs):.1f} B/item above the start, "
            f"kept {max(k for _, _, k in runs):.1f} B/item"
        )
    inputs = corpus.languages.of_item.nbytes + corpus.of_bucket.nbytes + corpus.text.nbytes
    print(f"the plan's inputs (group, bucket, text of each item): {inputs / items:.0f} B/item")


def measure(part, epoch: int, items: int) -> tuple[float, float, float]:
    """(seconds to build epoch `epoch`, the peak resident bytes per item it added, the
    bytes per item the plan keeps: kept_epochs of its order and batch arrays)."""
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM), Linux
    before = rss("VmRSS")
    t0 = time.perf_counter()
    layout = part.layout(epoch)
    seconds = time.perf_counter() - t0
    peak = (rss("VmHWM") - before) / items
    arrays = (layout.order, layout.starts, layout.buckets)
    return seconds, peak, kept_epochs(part) * sum(a.nbytes for a in arrays) / items


def rss(field: str) -> int:
    """This process's resident memory, bytes (VmRSS now, VmHWM its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, help="clips (default 200,000; --upsampled 2,000)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--build", type=int, default=0, help="time one epoch's plan of N items")
    parser.add_argument("--speakers", type=int, default=0, help="--build: also K Zipf speakers")
    parser.add_argument("--plot", help="also draw the comparison into this PNG")
    parser.add_argument("--upsampled", action="store_true", help="padding, a group drawn 4-7x")
    parser.add_argument("--corpora", type=int, default=4, help="--upsampled: corpora (seeds)")
    parser.add_argument("--epochs", type=int, default=3, help="--upsampled: epochs of each")
    args = parser.parse_args()
    if args.upsampled:
        upsampled(args.items or 2000, args.corpora, args.epochs)
    elif args.build:
        build(args.build, args.rounds, args.speakers)
    else:
        compare(args.items or 200_000, args.rounds, args.steps, args.plot)


if __name__ == "__main__":
    main()
