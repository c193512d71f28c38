"""Train the same global batches on one device and on two replicas; print both losses.

Run by tests/process/test_replicas.py in a fresh process (logical CPU devices must be set
before TensorFlow initialises): ``python -m tests.support.replica_steps ROWS:BUCKETED:STEPS ...``.
Prints one JSON line per case: {"single": [...], "replicas": [...], "traces", "devices"}.
The replicas' step is XLA-compiled; the single-device reference is not (half the
compile time of the test, and the same math).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

CONFIGURED: list[bool] = []


def batches(cfg, rows: int, bucketed: bool, steps: int) -> list[dict[str, np.ndarray]]:
    """Random global batches; with buckets two shapes, alternating; rows with few true
    frames, one empty row, so the replicas' frame shares differ."""
    rng = np.random.default_rng(0)
    out = []
    for step in range(steps):
        frames = 32 if bucketed and step % 2 else cfg.features.max_frames
        text = 16 if bucketed and step % 2 else cfg.text.max_text_len
        mel_lens = rng.integers(1, frames + 1, rows).astype(np.int32)
        mel_lens[-1] = 0
        out.append(
            {
                "tokens": rng.integers(1, cfg.vocab_size, (rows, text)).astype(np.int32),
                "text_lens": rng.integers(1, text + 1, rows).astype(np.int32),
                "mel": rng.normal(size=(rows, frames, cfg.features.n_mels)).astype(np.float32),
                "mel_lens": mel_lens,
                "items": np.arange(rows, dtype=np.int64),
                "speaker": rng.integers(0, 3, rows).astype(np.int32),
                "language": rng.integers(0, 2, rows).astype(np.int32),
            }
        )
    return out


def main(rows: int, bucketed: bool, steps: int) -> dict:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from ringfeed.consumer.devices import configure_tensorflow, plan_device
    from ringfeed.shared.config import config_from_dict

    stager = {"batch_size": rows, "buckets": [32, 64]} if bucketed else {"batch_size": rows}
    cfg = config_from_dict(
        {
            "stager": stager,
            "features": {"max_frames": 64},
            "text": {"max_text_len": 24},
            "model": {"kwargs": {"d_model": 16, "n_layers": 1, "dropout": 0.0}},
            "train": {"mixed_precision": False, "learning_rate": 0.01},
            "devices": {"cpu_replicas": 2},
        }
    )
    plan = plan_device("trainer", cfg, 0)
    import keras
    import tensorflow as tf

    if not CONFIGURED:  # the first case of this process
        tf.config.threading.set_intra_op_parallelism_threads(1)
        configure_tensorflow(plan)
        CONFIGURED.append(True)
    from ringfeed.consumer.trainer import model as model_module
    from ringfeed.consumer.trainer.replicas import DistributedStep, make_strategy
    from ringfeed.consumer.trainer.train_step import TrainStep, make_optimizer
    from ringfeed.shared.run.share import ONE_WORKER

    model_module.PRENET_DROPOUT = 0.0  # dropout draws differ per device: compare without
    data = batches(cfg, rows, bucketed, steps)
    keras.utils.set_random_seed(1)
    model, loss_fn = model_module.load_model_factory(cfg)
    weights = model.get_weights()
    single = TrainStep(model, make_optimizer(cfg), loss_fn, False, max_shapes=cfg.stager.n_shapes)
    losses = [float(single(b)) for b in data]
    strategy = make_strategy(cfg, plan, ONE_WORKER, [])
    with strategy.scope():
        model2, loss_fn = model_module.load_model_factory(cfg)
        model2.set_weights(weights)
        step = DistributedStep(
            strategy,
            model2,
            make_optimizer(cfg, clip=False),
            loss_fn,
            True,
            max_shapes=cfg.stager.n_shapes,
        )
    replicated = [float(step(b)) for b in data]
    return {
        "single": losses,
        "replicas": replicated,
        "traces": step.trace_count,
        "devices": strategy.num_replicas_in_sync,
    }


if __name__ == "__main__":
    for case in sys.argv[1:]:
        rows, bucketed, steps = case.split(":")
        print(json.dumps(main(int(rows), bucketed == "1", int(steps))), flush=True)
