"""Step timing for the trainer: where the time goes, over a rolling window.

The trainer process records, per step, the compute time of the step and how
long it waited for the next batch. Over the last ``window`` steps
(CV_WINDOW_STEPS, below) this gives the numbers the project exists to improve:

- wait_frac: share of wall time spent waiting for data (0 = never starved);
- step_time_cv: std / mean of step time (the starving baseline swings 50-80 %);
- samples_per_s: batch items over step + wait time;
- padding efficiency: true frames / padded frames of the batches (and the same
  for text), and useful_frames_per_s: true mel frames over step + wait time,
  what length buckets improve.

The math needs no TensorFlow; :class:`TensorBoardWriter` imports it lazily so
the inspector and tests can use the rest without it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

# Steps in the trainer's rolling window: at ~0.1-0.3 s a step, the last 5-15 s of
# training, long enough for a stable CV and short enough to show a stall as it happens.
CV_WINDOW_STEPS = 50


class StepMetrics:
    """Rolling step and data-wait timings; called by the trainer once per step."""

    def __init__(self, window: int = CV_WINDOW_STEPS) -> None:
        if window < 1:
            raise ValueError(f"StepMetrics window={window}: must be >= 1 step")
        self.window = window
        self.steps = 0
        self._step_s: deque[float] = deque(maxlen=window)
        self._wait_s: deque[float] = deque(maxlen=window)
        self._batch: deque[int] = deque(maxlen=window)
        self._frames: deque[int] = deque(maxlen=window)
        # step seconds, wait seconds, samples, true frames: whole run
        self._total = [0.0, 0.0, 0, 0]
        self._fills: deque[tuple[int, int, int, int]] = deque(maxlen=window)
        self._fill_total = [0, 0, 0, 0]

    def record(self, step_time_s: float, wait_s: float, batch_size: int, frames: int = 0) -> None:
        """One step: compute seconds, seconds waited for its batch, items in the batch,
        true mel frames in it."""
        self.steps += 1
        self._total[0] += step_time_s
        self._total[1] += wait_s
        self._total[2] += batch_size
        self._total[3] += frames
        self._step_s.append(step_time_s)
        self._wait_s.append(wait_s)
        self._batch.append(batch_size)
        self._frames.append(frames)

    def fill(self, fill: tuple[int, int, int, int]) -> None:
        """One batch's (true frames, padded frames, true tokens, padded tokens)."""
        self._fills.append(fill)
        self._fill_total = [a + b for a, b in zip(self._fill_total, fill, strict=True)]

    @staticmethod
    @staticmethod
    def _efficiency(fills: Any) -> dict[str, float]:
        totals = [sum(col) for col in zip(*fills, strict=True)] if fills else [0, 0, 0, 0]
        true_f, pad_f, true_t, pad_t = totals
        return {
            "padding_efficiency_frames": true_f / pad_f if pad_f else 0.0,
            "padding_efficiency_text": true_t / pad_t if pad_t else 0.0,
        }

    def summary(self) -> dict[str, float]:
        """Means over the window: step_time_s, wait_s, wait_frac, step_time_cv, samples_per_s.

        All zero before the first record; steps counts every record since start.
        """
        n = len(self._step_s)
        if n == 0:
            return (
                dict.fromkeys(
                    (
                        "step_time_s",
                        "wait_s",
                        "wait_frac",
                        "step_time_cv",
                        "samples_per_s",
                        "useful_frames_per_s",
                    ),
                    0.0,
                )
                | {"steps": 0}
                | self._efficiency(self._fills)
            )
        step_total, wait_total = sum(self._step_s), sum(self._wait_s)
        mean = step_total / n
        var = sum((s - mean) ** 2 for s in self._step_s) / n
        wall = step_total + wait_total
        return {
            "steps": self.steps,
            "step_time_s": mean,
            "wait_s": wait_total / n,
            "wait_frac": wait_total / wall if wall > 0 else 0.0,
            "step_time_cv": math.sqrt(var) / mean if mean > 0 else 0.0,
            "samples_per_s": sum(self._batch) / wall if wall > 0 else 0.0,
            "useful_frames_per_s": sum(self._frames) / wall if wall > 0 else 0.0,
        } | self._efficiency(self._fills)

    def run_summary(self) -> dict[str, float]:
        """Over every recorded step (not the window): step_time_s, wait_frac, samples_per_s,
        plus step_time_cv and step_time_median_s of the last window."""
        step_total, wait_total, samples, frames = self._total
        wall = step_total + wait_total
        steps = sorted(self._step_s)
        median = steps[len(steps) // 2] if steps else 0.0
        return {
            "steps": self.steps,
            "step_time_s": step_total / self.steps if self.steps else 0.0,
            "wait_frac": wait_total / wall if wall > 0 else 0.0,
            "samples_per_s": samples / wall if wall > 0 else 0.0,
            "useful_frames_per_s": frames / wall if wall > 0 else 0.0,
            **self._efficiency([self._fill_total]),
            "step_time_cv": self.summary()["step_time_cv"],
            "step_time_median_s": median,
        }


def format_line(step: int, loss: float, summary: dict[str, float], gpu: dict | None = None) -> str:
    """One console line: 'step 100 loss 1.2340 | 85.1 ms/step cv 4% | wait 2.0 ms (2%) | ...'."""
    line = (
        f"step {step} loss {loss:.4f} | {summary['step_time_s'] * 1e3:.1f} ms/step "
        f"cv {summary['step_time_cv']:.0%} | wait {summary['wait_s'] * 1e3:.1f} ms "
        f"({summary['wait_frac']:.0%}) | {summary['samples_per_s']:.1f} samples/s, "
        f"{summary.get('useful_frames_per_s', 0.0):.0f} useful frames/s"
    )
    if gpu:
        line += (
            f" | GPU {gpu['utilization_pct']:.0f}% "
            f"{gpu['memory_used_mib']:.0f}/{gpu['memory_total_mib']:.0f} MiB"
        )
    return line


class TensorBoardWriter:
    """Scalars to TensorBoard under log_dir; used by the trainer every log interval."""

    def __init__(self, log_dir: str) -> None:
        import tensorflow as tf

        self._tf = tf
        self._writer = tf.summary.create_file_writer(log_dir)

    def scalars(self, step: int, values: dict[str, Any], prefix: str = "") -> None:
        """Write every numeric value in values at step (non-numbers are skipped)."""
        with self._writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tf.summary.scalar(f"{prefix}{name}", float(value))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
