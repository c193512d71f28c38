"""The batch ring for a PyTorch training loop (docs/loaders.md).

``RingLoader(cfg, run_id, device="cuda:0")`` is an iterable of dicts of tensors on the
device, batch k + 1 copied while step k runs, with ``state_dict()`` and
``load_state_dict()`` for an exact resume; under torch.distributed each rank is one
training worker. Start the data side with ``ringfeed run CONFIG --consumer none
--run-id R``, or run your command as the model process: ``ringfeed run CONFIG --
python train.py``. Needs ``pip install ringfeed[torch]``.
"""

from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.cursor import PlanMismatch
from ringfeed.consumer.client.torch_loader import RingLoader, resolve_device, visible_devices
from ringfeed.shared.config import Config, load_config

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
