"""model.kwargs of the default model, checked without TensorFlow.

consumer/trainer/model.py builds the default model from them; scripts/preflight.py
checks them in `ringfeed validate` and before `ringfeed run`, so a bad value is
found before any process starts, not when the trainer builds its model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringfeed.shared.config.loader import build, check

DEFAULT_FACTORY = "ringfeed.consumer.trainer.model:build_default_model"


@dataclass(frozen=True)
class DefaultModelKwargs:
    """model.kwargs of the default model (build_default_model)."""

    d_model: int = 128
    n_layers: int = 3
    kernel_size: int = 5
    dropout: float = 0.1


def default_model_kwargs(kwargs: dict[str, Any]) -> DefaultModelKwargs:
    """model.kwargs checked for the default model; ConfigError names model.kwargs.<key>."""
    m = build(DefaultModelKwargs, kwargs, "model.kwargs")
    for name in ("d_model", "n_layers", "kernel_size"):
        value = getattr(m, name)
        check(value >= 1, f"model.kwargs.{name}", f"must be >= 1, got {value}")
    check(0 <= m.dropout < 1, "model.kwargs.dropout", f"must be in [0, 1), got {m.dropout}")
    return m
