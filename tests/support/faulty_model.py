"""A model factory whose training step fails, for tests/process/test_failures_propagate.py."""

from __future__ import annotations

from typing import Any

from ringfeed.consumer.trainer.model import build_default_model
from ringfeed.shared.config import Config


def build(cfg: Config, **kwargs: Any):
    """The default model (model.kwargs as its own) with a loss that raises while the
    step is traced."""

    def exploding_loss(*args):
        raise FloatingPointError("the loss exploded (tests/support/faulty_model.py)")

    return build_default_model(cfg, **kwargs), exploding_loss
