"""pytorch/examples' distributed/ddp-tutorial-series/multigpu_torchrun.py, ported to CPU.

What differs from the original, and why: gloo instead of nccl and no device placement
(CPU); the dataset inlined (datautils.py), it and the model seeded, so that runs compare; the mean
squared error instead of a cross entropy over the model's single output (whose gradient
is always zero); ``STEP_SECONDS`` of sleep after each batch (the real work of a step);
``TUTORIAL_BATCHNORM=1``, a BatchNorm layer in front of the model (one with buffers);
``TUTORIAL_WORKERS=N``, the loader's ``num_workers``;
the snapshot in the working directory; and a last line with the final loss and the
parameters' hash. tests/bin/ddp_tutorial_attached.py is this script under
``recovery.attach``: the diff in docs/quickstart-own-script.md.
"""
import hashlib
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import recovery


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.size = size
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator))
                     for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    recovery.init(backend="gloo")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        self.model = DDP(self.model)
        self.job = recovery.attach(self.model, self.optimizer, self.train_data)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        self.loss = loss.item()
        time.sleep(float(os.environ.get("STEP_SECONDS", "0")))

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        for source, targets in self.job.batches():
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {}
        snapshot["MODEL_STATE"] = self.model.module.state_dict()
        snapshot["EPOCHS_RUN"] = epoch
        torch.save(snapshot, "snapshot.pt")
        print(f"Epoch {epoch} | Training snapshot saved at snapshot.pt")

    def train(self, max_epochs: int):
        for epoch in self.job.epochs(max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    torch.manual_seed(0)
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    if os.environ.get("TUTORIAL_BATCHNORM"):  # a model with buffers, for a test
        model = torch.nn.Sequential(torch.nn.BatchNorm1d(20), model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        num_workers=int(os.environ.get("TUTORIAL_WORKERS", "0")),  # for a test
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def params_sha256(model: torch.nn.Module) -> str:
    hasher = hashlib.sha256()
    for tensor in model.state_dict().values():
        hasher.update(tensor.detach().numpy().tobytes())
    return hasher.hexdigest()


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    print(f"final loss={trainer.loss!r} params_sha256={params_sha256(model)}", flush=True)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
