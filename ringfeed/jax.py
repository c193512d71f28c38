"""The batch ring for a JAX training loop (docs/loaders.md).

``RingLoader(cfg, run_id)`` is an iterator of dicts of ``jax.Array`` placed with a
``jax.sharding.Sharding`` (data-parallel over the local devices by default), two
batches ahead of the step, with ``get_state()`` and ``set_state()`` for an exact
resume; under multi-host JAX each process is one training worker. Start the data side
with ``ringfeed run CONFIG --consumer none --run-id R``, or run your command as the
model process: ``ringfeed run CONFIG -- python train.py``. Needs ``pip install
ringfeed[jax]``.
"""

from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.cursor import PlanMismatch
from ringfeed.consumer.client.jax_loader import RingLoader, data_parallel, resolve_devices
from ringfeed.shared.config import Config, load_config

__all__ = [
    "Config",
    "PlanMismatch",
    "RingLoader",
    "StagerGone",
    "StagerRefused",
    "data_parallel",
    "load_config",
    "resolve_devices",
]
