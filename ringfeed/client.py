"""What a training loop of one's own needs (docs/running.md#the-data-side-alone).

``ring_dataset(cfg, run_id)`` is a run's batch ring as a ``tf.data.Dataset`` of dicts
with fixed element specs; ``BatchClient`` the same batches without TensorFlow;
``load_config`` reads a config file. Start the data side with
``ringfeed run CONFIG --consumer none --run-id R``.
"""

from ringfeed.consumer.client.batch_client import Batch, BatchClient, StagerGone
from ringfeed.shared.config import Config, load_config


def ring_dataset(cfg: Config, run_id: str, position: int = 0):  # noqa: ANN201 - tf.data
    """consumer.client.tf_dataset.ring_dataset, imported on first use (TensorFlow)."""
    from ringfeed.consumer.client.tf_dataset import ring_dataset as make

    return make(cfg, run_id, position)


__all__ = ["Batch", "BatchClient", "Config", "StagerGone", "load_config", "ring_dataset"]
