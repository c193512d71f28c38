"""The batch ring for a PyTorch training loop (docs/loaders.md).

``RingLoader(cfg, device="cuda:0")`` is an iterable of dicts of tensors on the device,
batch k + 1 copied while step k runs, one epoch per pass, with ``len``,
``state_dict()`` and ``load_state_dict()`` for an exact resume; under torch.distributed
each rank is one training worker. Given a config and no run, it starts the run's stager
and producers as child processes and ends them with the loop (scripts/data_side.py);
started by the launcher (``ringfeed run CONFIG -- python train.py``) it takes that run,
and ``RingLoader(cfg, run_id)`` a run started by hand. Needs ``pip install
ringfeed[torch]``.
"""

from ringfeed.consumer.client import torch_loader
from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.cursor import PlanMismatch
from ringfeed.consumer.client.torch_loader import resolve_device, visible_devices
from ringfeed.scripts.data_side import DataSide
from ringfeed.shared.config import Config, load_config


class RingLoader(torch_loader.RingLoader):
    __doc__ = torch_loader.RingLoader.__doc__
    # Given a config and no run, it starts the run's stager and producers itself.
    data_side_type = DataSide


__all__ = [
    "Config",
    "PlanMismatch",
    "RingLoader",
    "StagerGone",
    "StagerRefused",
    "load_config",
    "resolve_device",
    "visible_devices",
]
