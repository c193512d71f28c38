"""A tf.data adapter over the batch ring, for users who call model.fit on their own model.

Called in the user's training process, in place of consumer/trainer/trainer.py:

    ds = ring_dataset(cfg, run_id)      # stager and producers already running
    model.fit(ds, steps_per_epoch=..., epochs=...)

Each element is one whole batch as cfg.batch_fields(): a dict of tokens int32 [B,
T], text_lens int32 [B], mel float32 [B, F, n_mels], mel_lens int32 [B], items int64
[B] (each row's item, -1 on padding), position int64 [B] (each row's plan position,
-1 on padding: what a loop of one's own resumes from, ring_dataset(position=...)),
valid bool [B] (True for a real row; a batch the plan could not fill ends in padding
rows, which hold zeros and lengths 0), speaker and language int32 [B] (ids in the
run's tables, runs/<run-id>/ids.json; padding rows carry the reserved padding ids:
shared/run/id_tables.py padding_ids; docs/running.md#what-a-batch-says-about-itself),
then every optional field of the declared schema
(docs/sample-fields.md: ref_mel, pitch, voiced, energy, the user's, with <name>_lens for a
field of its own length). Without length buckets the element_spec is fully static, so a
model compiled with jit_compile=True traces once. With length buckets
(stager.buckets) B, T and F are None in the element_spec and each element has its
bucket's shape: Keras compiles the step once per shape, that is once per bucket
(keep the model's Inputs at None for those dims).
Split the dict into (inputs, targets) with `ds.map(...)` as the model needs.

The generator owns its BatchClient (tf.data runs it in one thread at a time)
and copies each batch before freeing the slot: the stager refills the slot as
soon as it is freed. It sends BYE when the plan ends (finite stager.epochs);
a dataset dropped early closes the client without BYE, so the stager keeps
serving a later consumer. Compared with the trainer it loses the overlap of
copy and step unless the user adds `.prefetch(1)`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.shared.config import Config


def element_spec(cfg: Config) -> dict[str, tf.TensorSpec]:
    """TensorSpecs of one element: every field of the declared schema's batch
    (cfg.schema.batch_specs); with length buckets the batch dim and each length dim a
    bucket cuts are None (each bucket has its own)."""
    specs = cfg.schema.batch_specs(cfg.stager.batch_size, cfg.stager.bucketed)
    return {
        name: tf.TensorSpec(shape, tf.as_dtype(dtype), name=name)
        for name, (shape, dtype) in specs.items()
    }


def _batches(cfg: Config, run_id: str, position: int) -> Iterator[dict[str, np.ndarray]]:
    # rejoin: each iteration (a Keras epoch) makes a new generator in this process while
    # the last one's client may not be closed yet; the new one is the consumer now.
    client = BatchClient(cfg, run_id, "tf.data", position, rejoin=True)
    finished = False
    try:
        client.connect(timeout_s=cfg.train.connect_timeout_s)
        while True:
            try:
                batch = client.next(timeout_s=cfg.train.data_timeout_s)
            except TimeoutError:
                raise TimeoutError(client.stager_verdict(cfg.train.data_timeout_s)) from None
            if batch is None:
                finished = True
                return
            # A real copy: after free() the stager overwrites the slot under the views.
            arrays = {name: np.array(view, copy=True) for name, view in batch.arrays.items()}
            client.free(batch)
            yield arrays
    finally:
        client.close(finished=finished)


def ring_dataset(cfg: Config, run_id: str, position: int = 0) -> tf.data.Dataset:
    """Batches of run `run_id` from plan `position` on, as a tf.data.Dataset of dicts.

    The stager must be running or starting (a `ringfeed run` or `stager` process of that
    run id; it has train.connect_timeout_s to answer): a run id nobody starts is an error
    within seconds (docs/running.md#the-data-side-alone). Only one
    consumer is served at a time: iterating a second dataset of the same run in this
    process takes the run over (rejoin) and restarts the plan at its position for that
    one; a consumer of another process is refused while this one lives.
    """
    return tf.data.Dataset.from_generator(
        lambda: _batches(cfg, run_id, position), output_signature=element_spec(cfg)
    )
