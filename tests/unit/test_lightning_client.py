"""Lightning as a client of ringfeed.torch's loader, against the real stager in this
process: `max_epochs` over an endless plan gives each epoch its own batches, counted by
`len` (the progress bar's total); a fit stopped after 4 steps and resumed from its
checkpoint trains every position of the epoch once, with Lightning's read-ahead off
(the loader has a len) and on (a loader without one: Lightning's fetcher then fetches
batch k + 1 before step k). Every row is checked against its item."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.sources import check_synthetic_rows
from tests.support.configs import small
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

torch = pytest.importorskip("torch")
lightning = pytest.importorskip("lightning")

from ringfeed.torch import RingLoader  # noqa: E402

torch.set_num_threads(1)

N = 48
RAW = {
    "data": {"synthetic_items": N, "synthetic_lengths": "ljspeech"},
    "features": {"max_frames": 32},
}


def config(tmp_path: Path, epochs: int) -> Path:
    stager = {"batch_size": 4, "buckets": [16, 24, 32], "epochs": epochs}
    return small(tmp_path, N, 0.0, **RAW, stager=stager)


class Model(lightning.LightningModule):
    """A linear layer over the mels; records the (epoch, position) of every real row."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(80, 80)
        self.seen: list[tuple[int, int]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        arrays = {name: t.numpy() for name, t in batch.items()}
        valid = arrays["valid"]
        check_synthetic_rows(arrays, int(valid.sum()), self.cfg)
        rows = zip(arrays["epoch"][valid].tolist(), arrays["position"][valid].tolist(), strict=True)
        self.seen += list(rows)
        mel = batch["mel"]
        return ((self.layer(mel) - mel).abs() * batch["valid"][:, None, None]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SaveAt(lightning.Callback):
    """A checkpoint at the end of training step `step` (mid-epoch), as ModelCheckpoint
    with every_n_train_steps writes it."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class ReadAhead(RingLoader):
    """A loader whose len Lightning cannot take: its fetcher reads one batch ahead."""

    def __len__(self) -> int:
        raise TypeError("no len")


def trainer(root: Path, **kw: object) -> lightning.Trainer:
    return lightning.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kw,
    )


def model_for(loader: RingLoader) -> Model:
    model = Model()
    model.cfg = loader.cfg
    return model


def test_max_epochs_over_an_endless_plan_trains_each_epoch_once(tmp_path: Path) -> None:
    with stager_thread(config(tmp_path, epochs=0)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, progress_every=0)
            model = model_for(loader)
            fit = trainer(tmp_path, max_epochs=2)
            fit.fit(model, train_dataloaders=loader)
            per_epoch = len(loader)
            loader.close(finished=True)
    assert fit.num_training_batches == per_epoch > 1, "the progress bar's total"
    for epoch in (0, 1):
        positions = [p for e, p in model.seen if e == epoch]
        assert sorted(positions) == list(range(epoch * N, (epoch + 1) * N))


@pytest.mark.parametrize("kind", [RingLoader, ReadAhead], ids=["len", "read-ahead"])
def test_a_resumed_fit_trains_every_position_once(tmp_path: Path, kind: type) -> None:
    with stager_thread(config(tmp_path, epochs=1)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            first = kind(stager.cfg, stager.run_id, progress_every=0)
            head = model_for(first)
            fit = trainer(tmp_path, max_steps=4, callbacks=[SaveAt(tmp_path / "step4.ckpt", 4)])
            fit.fit(head, train_dataloaders=first)
            first.close()  # the process ends: the run waits for the next consumer
            second = kind(stager.cfg, stager.run_id, progress_every=0)
            tail = model_for(second)
            trainer(tmp_path, max_epochs=1).fit(
                tail, train_dataloaders=second, ckpt_path=tmp_path / "step4.ckpt"
            )
            second.close(finished=True)  # Lightning stops at len: the script's end says BYE
    positions = [p for _, p in head.seen + tail.seen]
    assert len({p for _, p in head.seen}) and positions == list(range(N)), np.diff(positions)
