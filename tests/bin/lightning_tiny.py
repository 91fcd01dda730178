"""A tiny PyTorch Lightning job as a user writes it for torchrun: Trainer(strategy="ddp"),
a checkpoint every few steps, and a restart that resumes from the last one.

Usage: lightning_tiny.py CKPT_DIR MAX_STEPS [--last-words | --restartable] [--timing=DIR]
``--last-words`` adds recovery.lightning.LastWordsCheckpoint to the trainer's callbacks
(the group restart's way); ``--restartable`` takes recovery.lightning.RestartableDDP() for
``strategy="ddp"`` (the survivors keep their processes): each the one change its way asks
of a script. Prints ``start step=<k>`` when fitting
begins (k > 0: resumed), ``step=<n>`` after each step, and ``done step=<n> loss=<x>`` at
the end (the trained model's loss on the whole data set), and saves its parameters, flat,
to ``CKPT_DIR/final_params_<rank>.pt``.

Each rank's share of the data is one batch, so an epoch is one step: a plain DataLoader
cannot resume inside an epoch (Lightning starts the epoch's iterator again), and so a
resume at any step sees the batches of a fault-free run.
"""

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from timing import record
from torch.utils.data import DataLoader, TensorDataset

BATCH = 32


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)  # a step long enough to be killed in
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Report(Callback):
    def on_train_start(self, trainer, module) -> None:
        print(f"start step={trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        print(f"step={trainer.global_step}", flush=True)
        record(f"{trainer.global_step} {time.time()} {os.getpid()}")


def main() -> None:
    ckpt_dir, max_steps = sys.argv[1], int(sys.argv[2])
    world = int(os.environ["WORLD_SIZE"])
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(BATCH * world, 8, generator=generator),
                         torch.randn(BATCH * world, 1, generator=generator))
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=10, save_last=True, save_top_k=0),
                 Report()]
    if "--last-words" in sys.argv[3:]:
        from recovery.lightning import LastWordsCheckpoint

        callbacks.append(LastWordsCheckpoint())
    strategy = "ddp"
    if "--restartable" in sys.argv[3:]:
        from recovery.lightning import RestartableDDP

        strategy = RestartableDDP()
    trainer = L.Trainer(
        strategy=strategy, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), max_steps=max_steps, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    last = os.path.join(ckpt_dir, "last.ckpt")
    torch.manual_seed(0)
    model = Tiny()
    trainer.fit(model, DataLoader(data, batch_size=BATCH),
                ckpt_path=last if os.path.exists(last) else None)
    x, y = data.tensors
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model.layer(x), y).item()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(params, os.path.join(ckpt_dir, f"final_params_{os.environ['RANK']}.pt"))
    print(f"done step={trainer.global_step} loss={loss!r}", flush=True)
    record(repr(loss), "loss")


if __name__ == "__main__":
    main()
