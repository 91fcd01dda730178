"""A plain DDP script in pytorch/examples' multigpu_torchrun.py pattern, with its entry point
decorated ``@recovery.restartable`` (next to torchrun's ``@record``).

Usage: restartable_ddp.py OUT_DIR TOTAL_STEPS SAVE_EVERY [HOLD_RANK]

DDP model, DistributedSampler, a snapshot that rank 0 writes every SAVE_EVERY steps and that
every call of ``main`` resumes from. Each call prints ``rank R pid P starts at step S``;
each step ``step=S``; at the end each rank writes OUT_DIR/params_<rank>.json with a digest
of its parameters. With HOLD_RANK, that rank's first call in the job prints
``rank R holds before init_process_group`` and sleeps a minute there: the others wait
for it in their rendezvous.
"""

import hashlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import recovery


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader,
                 optimizer: torch.optim.Optimizer, save_every: int, snapshot_path: str) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.steps_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.steps_run = snapshot["STEPS_RUN"]

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(source), targets).backward()
        self.optimizer.step()

    def _save_snapshot(self, steps: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(),
                    "OPTIMIZER_STATE": self.optimizer.state_dict(), "STEPS_RUN": steps}
        torch.save(snapshot, self.snapshot_path + ".tmp")
        os.replace(self.snapshot_path + ".tmp", self.snapshot_path)

    def train(self, total_steps: int) -> None:
        print(f"rank {self.rank} pid {os.getpid()} starts at step {self.steps_run}", flush=True)
        per_epoch = len(self.train_data)
        step = self.steps_run
        while step < total_steps:
            epoch, skip = divmod(step, per_epoch)
            self.train_data.sampler.set_epoch(epoch)
            for index, (source, targets) in enumerate(self.train_data):
                if index < skip:
                    continue
                self._run_batch(source, targets)
                step += 1
                print(f"step={step}", flush=True)
                time.sleep(0.05)  # the real work of a step, so that a test can kill a rank mid-run
                if self.rank == 0 and step % self.save_every == 0:
                    self._save_snapshot(step)
                if step == total_steps:
                    break


def load_train_objs() -> tuple[TensorDataset, torch.nn.Module, torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(0)
    train_set = TensorDataset(torch.randn(512, 20, generator=generator),
                              torch.randint(0, 4, (512,), generator=generator))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train_set, model, optimizer


def prepare_dataloader(dataset: TensorDataset, batch_size: int) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False,
                      sampler=DistributedSampler(dataset, seed=0))


def digest(model: torch.nn.Module) -> str:
    hasher = hashlib.sha256()
    for tensor in model.state_dict().values():
        hasher.update(tensor.detach().numpy().tobytes())
    return hasher.hexdigest()


@record
@recovery.restartable
def main(out_dir: str, total_steps: int, save_every: int, hold_rank: int = -1) -> None:
    held = os.path.join(out_dir, "held")
    if int(os.environ["RANK"]) == hold_rank and not os.path.exists(held):
        open(held, "w").close()
        print(f"rank {hold_rank} holds before init_process_group", flush=True)
        time.sleep(60)
    init_process_group(backend="gloo")
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size=16)
    trainer = Trainer(model, train_data, optimizer, save_every,
                      os.path.join(out_dir, "snapshot.pt"))
    trainer.train(total_steps)
    with open(os.path.join(out_dir, f"params_{trainer.rank}.json"), "w") as f:
        json.dump({"final": digest(trainer.model.module)}, f)
    destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(int, sys.argv[4:5]))
