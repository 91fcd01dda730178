"""A tiny PyTorch Lightning job as a user writes it for torchrun: Trainer(strategy="ddp"),
a checkpoint every few steps, and a restart that resumes from the last one.

Usage: lightning_tiny.py CKPT_DIR MAX_STEPS
Prints ``start step=<k>`` when fitting begins (k > 0: resumed) and ``done step=<n>``.
"""

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)  # a step long enough to be killed in
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Report(Callback):
    def on_train_start(self, trainer, module) -> None:
        print(f"start step={trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        print(f"step={trainer.global_step}", flush=True)


def main() -> None:
    ckpt_dir, max_steps = sys.argv[1], int(sys.argv[2])
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 8, generator=generator),
                         torch.randn(512, 1, generator=generator))
    trainer = L.Trainer(
        strategy="ddp", accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), max_steps=max_steps, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=5, save_last=True,
                                   save_top_k=0), Report()])
    last = os.path.join(ckpt_dir, "last.ckpt")
    trainer.fit(Tiny(), DataLoader(data, batch_size=8),
                ckpt_path=last if os.path.exists(last) else None)
    print(f"done step={trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
