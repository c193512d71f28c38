"""The batch ring for a JAX training loop (docs/loaders.md).

``RingLoader(cfg)`` is an iterator of dicts of ``jax.Array`` placed with a
``jax.sharding.Sharding`` (data-parallel over the local devices by default), two
batches ahead of the step, one epoch per pass, with ``len``, ``get_state()`` and
``set_state()`` for an exact resume; under multi-host JAX each process is one training
worker. Given a config and no run, it starts the run's stager and producers as child
processes and ends them with the loop (scripts/data_side.py); started by the launcher
(``ringfeed run CONFIG -- python train.py``) it takes that run, and ``RingLoader(cfg,
run_id)`` a run started by hand. Needs ``pip install ringfeed[jax]``.
"""

from ringfeed.consumer.client import jax_loader
from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.cursor import PlanMismatch
from ringfeed.consumer.client.jax_loader import data_parallel, resolve_devices
from ringfeed.scripts.data_side import DataSide
from ringfeed.shared.config import Config, load_config


class RingLoader(jax_loader.RingLoader):
    __doc__ = jax_loader.RingLoader.__doc__
    # Given a config and no run, it starts the run's stager and producers itself.
    data_side_type = DataSide


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
