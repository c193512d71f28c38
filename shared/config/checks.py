"""The checks that span sections: each section checks its own keys when it is built
(its ``__post_init__``), these the rules between them.

Called once per Config, from its __post_init__ (shared/config/config.py); each failed
check raises ConfigError naming the key and what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfeed.shared.config.loader import check

if TYPE_CHECKING:
    from ringfeed.shared.config.config import Config


def validate(cfg: Config) -> None:
    """Every rule between sections; raises ConfigError naming the key and the fix."""
    f, r = cfg.features, cfg.ring
    check(
        0 <= f.fmin < f.fmax <= cfg.audio.sample_rate / 2,
        "features.fmax",
        f"need 0 <= fmin < fmax <= sample_rate/2 = {cfg.audio.sample_rate / 2}",
    )
    check(
        cfg.producers.orphan_s > 2 * r.lease_s,
        "producers.orphan_s",
        f"{cfg.producers.orphan_s} s must exceed two ring.lease_s ({r.lease_s} s): "
        "a producer must outlast a stager's restart and its own HELLO again",
    )
    _validate_buckets(cfg)


def _validate_buckets(cfg: Config) -> None:
    s, top = cfg.stager, cfg.features.max_frames
    if not s.bucketed:
        return
    if s.buckets:
        check(
            s.buckets[-1] == top,
            "stager.buckets",
            f"the largest bucket ({s.buckets[-1]}) must equal features.max_frames={top}: "
            "it sets the slot size",
        )
    check(
        cfg.batch_frames >= top,
        "stager.batch_frames",
        f"{cfg.batch_frames} < features.max_frames={top}: the longest bucket needs a row",
    )
