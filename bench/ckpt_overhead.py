"""What checkpointing every N steps costs the training loop: sync against async saving.

    python bench/ckpt_overhead.py [--steps 300] [--every 10] [--rounds 5] [--dir DIR] [--device cuda] [--json]

Trains the main job's MLP (784-512-512-10, SGD with momentum, batch 32) in one process
with no saving, with synchronous saving and with background (async) saving, the three
interleaved round after round, and prints each one's best step time in steady state (as
``timeit`` does: the round least disturbed by other load) and its ratio to no saving,
beside it the ratio with the saver's one-off close counted (see :func:`step_times`), and
the median over the rounds of each round's ratio to that round's run without saving. The design target
is an async ratio of at most 1.05. The machine's load average before and after, and each
mode's spread over the rounds, say how quiet the machine was. Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "templates" / "mnist"))
from train import build_model  # noqa: E402 - the template's model, found through its folder

from recovery.ckpt.checkpoint import CheckpointConfig, CheckpointSaver  # noqa: E402

MODES = ("none", "sync", "async")


def step_times(mode: str, steps: int, every: int, directory: Path, device: str) -> tuple[float, float]:
    """Seconds per step in one mode: in steady state, and with the saver's close counted.

    The steady window runs from just after one save to just after the save ``steps``
    steps later (``steps`` is a multiple of ``every``): it holds exactly ``steps / every``
    saves, and the write in flight at its end stands for the one in flight at its start.
    The saver is made (its writer forked, its buffer allocated by a first save) before the
    window. The second figure adds the saver's ``close`` after the window: the wait for
    the last write and the writer's exit, which a job pays once, not every ``every`` steps.
    """
    torch.manual_seed(0)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    saver = None
    if mode != "none":
        config = CheckpointConfig(save_checkpoint_steps=every, keep_checkpoint_max=2, async_save=mode == "async")
        saver = CheckpointSaver(model, optimizer, config=config, prefix=mode, directory=directory)
    inputs, labels = torch.randn(32, 784, device=device), torch.randint(0, 10, (32,), device=device)
    warmup = 2 * every
    for global_step in range(1, warmup + steps + 1):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        if saver is not None:
            saver.step_end(1, global_step, global_step)
        if global_step == warmup:
            started = time.perf_counter()
    if device != "cpu":
        torch.cuda.synchronize()
    steady = time.perf_counter() - started
    if saver is not None:
        saver.close()
    return steady / steps, (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=10, help="checkpoint interval in steps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    steps = -(-args.steps // args.every) * args.every  # whole save intervals
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    closed: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for round_ in range(args.rounds):
            for mode in MODES:
                steady, with_close = step_times(mode, steps, args.every, Path(scratch) / f"{mode}{round_}", args.device)
                times[mode].append(steady)
                closed[mode].append(with_close)
    base = min(times["none"])
    result = {
        "bench": "ckpt_overhead", "torch": torch.__version__, "device": args.device,
        "threads": torch.get_num_threads(), "steps": steps, "every": args.every, "rounds": args.rounds,
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        **{f"{mode}_ms": round(min(times[mode]) * 1e3, 4) for mode in MODES},
        **{f"{mode}_ratio": round(min(times[mode]) / base, 4) for mode in MODES},
        **{f"{mode}_ratio_with_close": round(min(closed[mode]) / base, 4) for mode in MODES if mode != "none"},
        **{f"{mode}_ratio_median": round(statistics.median(
            t / n for t, n in zip(times[mode], times["none"])), 4) for mode in MODES if mode != "none"},
        "spread": {mode: round(max(times[mode]) / min(times[mode]), 3) for mode in MODES},
        "target": "async_ratio <= 1.05",
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"step time in steady state, best of {args.rounds} rounds of {steps} steps, checkpoint every "
          f"{args.every} steps (torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads)")
    for mode in MODES:
        best = min(times[mode])
        with_close = f"   with the close {result[f'{mode}_ratio_with_close']:5.3f}" if mode != "none" else ""
        median = f"   median of the rounds' ratios {result[f'{mode}_ratio_median']:5.3f}" if mode != "none" else ""
        print(f"  {mode:<6} {best * 1e3:8.3f} ms/step   ratio {best / base:5.3f}   "
              f"spread over rounds {result['spread'][mode]:.2f}x{with_close}{median}")
    print(f"  load average {result['load_before']} before, {result['load_after']} after")


if __name__ == "__main__":
    main()
