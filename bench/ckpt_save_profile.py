"""Where the time of an async save goes: the training thread's part, the steps after it, the writer's CPU.

    python bench/ckpt_save_profile.py [--saves 150] [--every 10]

Trains the main job's MLP (as ``bench/ckpt_overhead.py``) without a saver, then with an
async one saving every ``--every`` steps, and prints: each step's median time by its place
after a save (0: the step that saves, its save included) less the median step without a
saver; the save step's parts (state dicts, the walk that checks them and takes the
tensors, the wait for the previous write, the copy into shared memory, the message), wall
and CPU of the training thread; and the writer process's CPU a save (``/proc``, in clock
ticks). Torch threads are set with ``OMP_NUM_THREADS``. Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "templates" / "mnist"))
from train import build_model  # noqa: E402 - the template's model, found through its folder

from recovery.ckpt import checkpoint, staging, writer_process  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_wall: collections.Counter[str] = collections.Counter()
_cpu: collections.Counter[str] = collections.Counter()


def _timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` to add its wall and thread CPU time to ``label``."""
    call: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            _wall[label] += time.perf_counter() - wall
            _cpu[label] += time.thread_time() - cpu

    setattr(owner, name, timed)


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _run(saves: int, every: int, async_save: bool) -> tuple[list[list[float]], float, float]:
    """Step times by place after a save, seconds a step over the run, writer CPU seconds."""
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    inputs, labels = torch.randn(32, 784), torch.randint(0, 10, (32,))
    saver = None
    with tempfile.TemporaryDirectory() as directory:
        if async_save:
            config = checkpoint.CheckpointConfig(save_checkpoint_steps=every, keep_checkpoint_max=2, async_save=True)
            saver = checkpoint.CheckpointSaver(model, optimizer, config=config, directory=directory)
        by_place: list[list[float]] = [[] for _ in range(every)]
        warmup = 5 * every
        writer_cpu = started = 0.0
        for step in range(1, every * saves + warmup + 1):
            if step == warmup + 1:
                _wall.clear()
                _cpu.clear()
                writer_cpu = _process_cpu(saver._writer.pid) if saver and saver._writer else 0.0
                started = time.perf_counter()
            begun = time.perf_counter()
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            if saver is not None:
                saver.step_end(1, step, step)
            if step > warmup:
                by_place[step % every].append(time.perf_counter() - begun)
        per_step = (time.perf_counter() - started) / (every * saves)
        if saver is not None and saver._writer is not None:
            writer_cpu = _process_cpu(saver._writer.pid) - writer_cpu
            saver.close()
    return by_place, per_step, writer_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=150)
    parser.add_argument("--every", type=int, default=10, help="checkpoint interval in steps")
    args = parser.parse_args()
    _timed(checkpoint.CheckpointSaver, "_state_dicts", "state dicts")
    _timed(checkpoint, "_plain", "walk (check, take tensors)")
    _timed(writer_process.WriterProcess, "wait", "wait for the previous write")
    _timed(staging.SharedStage, "stage", "copy into shared memory")
    _timed(writer_process.WriterProcess, "submit", "message to the writer")
    _timed(checkpoint.CheckpointSaver, "save", "save step, all")
    plain, plain_step, _ = _run(args.saves, args.every, async_save=False)
    places, async_step, writer_cpu = _run(args.saves, args.every, async_save=True)
    base = statistics.median(t for place in plain for t in place) * 1e3
    print(f"{torch.get_num_threads()} torch threads, {args.saves} saves, one every {args.every} steps, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"no saver: median step {base:.3f} ms, {plain_step * 1e3:.3f} ms a step over the run")
    print(f"async:    {async_step * 1e3:.3f} ms a step over the run, ratio {async_step / plain_step:.3f}")
    print("median step by place after the save (0: the step that saves), less the median without a saver, ms:")
    print("  " + "  ".join(f"{i}:{statistics.median(place) * 1e3 - base:+.3f}" for i, place in enumerate(places)))
    print("the save step's parts, ms a save (means; the message includes a wait, already done):")
    for label in _wall:
        print(f"  {label:30s} wall {_wall[label] / args.saves * 1e3:7.3f}  cpu {_cpu[label] / args.saves * 1e3:7.3f}")
    print(f"  writer process CPU             {writer_cpu / args.saves * 1e3:7.3f} ms a save "
          f"(/proc, {1000 // _TICK} ms ticks)")


if __name__ == "__main__":
    main()
