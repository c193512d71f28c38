"""Keys of earlier versions of the schema, and where each went.

A config of an older shape gets one line saying where its key went instead of
"unknown key" (called by shared/config/config.py before the config is built).
"""

from __future__ import annotations

from typing import Any

from ringfeed.shared.config.loader import ConfigError

_TESTS_ONLY = (
    "fault injection is for tests only (RINGFEED_SOURCE_HOOK, tests/support/fault_sources.py)"
)
MOVED_KEYS = {
    "model.d_model": "moved to model.kwargs.d_model",
    "model.n_layers": "moved to model.kwargs.n_layers",
    "model.kernel_size": "moved to model.kwargs.kernel_size",
    "model.dropout": "moved to model.kwargs.dropout",
    "run.root": "moved to run_root",
    "devices.trainer_gpu": "moved to devices.model (a list of GPU indices, one per replica)",
    "text.cache_size": "no longer a setting (a constant in producer/text/encoder.py)",
    "train.cv_window": "no longer a setting (a constant in consumer/trainer/metrics.py)",
    "features.log_floor": "no longer a setting (LOG_FLOOR in shared/sample/content.py)",
    "ring.slots": (
        "no longer a setting: producers write each sample into the batch it is delivered "
        "in; ring.lookahead sets how many batches they fill ahead (0: from the producers), "
        "ring.spares the spare places (docs/design.md#the-look-ahead)"
    ),
    "data.synthetic_raise": _TESTS_ONLY,
    "data.synthetic_exit": _TESTS_ONLY,
    "data.synthetic_delay_s": _TESTS_ONLY,
}


# ringfeed's own model factory before the package moved under `ringfeed.`: an earlier
# config or a checkpoint's copy names it so. Only these names: a user's own package
# may well be called `scripts` or `consumer`.
MOVED_FACTORIES = {
    "consumer.trainer.model:build_default_model": (
        "ringfeed.consumer.trainer.model:build_default_model"
    ),
}


def check_moved(raw: dict[str, Any]) -> None:
    """Raise ConfigError for a key of an earlier schema (MOVED_KEYS) in a raw config
    mapping, saying where it went; ringfeed's own old model.factory is renamed."""
    for key, note in MOVED_KEYS.items():
        section, name = key.split(".")
        if isinstance(raw.get(section), dict) and name in raw[section]:
            raise ConfigError(f"{key}: {note}")
    model = raw.get("model")
    factory = model.get("factory") if isinstance(model, dict) else None
    if isinstance(factory, str) and factory in MOVED_FACTORIES:
        model["factory"] = MOVED_FACTORIES[factory]
