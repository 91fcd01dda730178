"""What phase reporting costs a training step: ``recovery.wrap_optimizer`` against the plain optimizer.

    PYTHONPATH=. python bench/phase_overhead.py [--steps 200] [--rounds 15] [--threads 1]
        [--tftrun_workers 2] [--tftrun_rounds 10] [--tftrun_steps 100] [--json]

Issue 6 asks that marking each step computing / updating / done (and telling the
scheduler, through the heartbeat) slow training down by nothing measurable. Three parts:

1. **One process**: the main job's step (jobs/phase_steps.py: the template's MLP, SGD,
   batch 32) plain, wrapped, and plain again, interleaved round after round. The wrapped
   variant's listener is the real ``ClusterContext.report_phase`` of a context whose
   heartbeat is a stand-in object (the method stores the phase there for the next beat).
2. **The wrapper alone**: ``start_step`` plus a wrapped ``optimizer.step()`` around a step
   that does nothing, against calling that empty step bare; best of several repeats, as
   ``timeit`` advises. The difference is what the wrapper adds per training step, shown
   also as a share of the plain step of part 1.
3. **Under tftrun** (``--tftrun_workers`` ranks; 0 skips it): the same three variants in a
   real job (jobs/phase_loop.py), with the gradient all-reduce in the step, the heartbeat
   thread running and the phases going to the live context; rank 0's times.

For parts 1 and 3: the median and the best (least disturbed) ms/step of each variant, and
its ratio to ``plain``: the median over rounds of (variant / plain of the same round),
with the lowest and highest round, and the ratio of the bests. The target is a
``wrapped`` ratio ≤ 1.01, or one within the spread that ``plain again`` shows (two
identical variants: the noise band). Run by hand; not a test.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import timeit
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
from common import add_json_flag, emit, median, tftrun_cmd
from jobs.phase_steps import VARIANTS, PhaseBench

from recovery.runtime.cluster import ClusterContext
from recovery.train.phase import phase_of

JOB = Path(__file__).resolve().parent / "jobs" / "phase_loop.py"


def report_phase_listener() -> Callable[[str], None]:
    """``ClusterContext.report_phase``, as ``ElasticTrainer`` installs it, of a context whose
    session is a stand-in holding what the method writes (the heartbeat's phase) and the link
    the constructor reads."""
    session = SimpleNamespace(heartbeat=SimpleNamespace(phase=None), link=None)
    return ClusterContext(0, 1, 0, "bench", 0, "gloo", session=session).report_phase  # type: ignore[arg-type]


def wrapper_seconds(listener: Callable[[str], None], number: int = 100_000, repeat: int = 7) -> float:
    """Seconds the wrapper adds to one step: the best of ``repeat`` timings of ``number``
    wrapped empty steps (with ``start_step``) minus the best of as many bare ones."""
    def empty_optimizer() -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
        optimizer.step = lambda *args, **kwargs: None  # type: ignore[method-assign]
        return optimizer

    bare, wrapped = empty_optimizer(), empty_optimizer()
    tracker = phase_of(wrapped)
    tracker.listener = listener

    def wrapped_step() -> None:
        tracker.start_step(1)
        wrapped.step()

    best = {name: min(timeit.repeat(step, number=number, repeat=repeat)) / number
            for name, step in (("bare", bare.step), ("wrapped", wrapped_step))}
    return best["wrapped"] - best["bare"]


def paired_ratios(times: Mapping[str, Sequence[float]], name: str) -> list[float]:
    """Per round, ``name``'s time over ``plain``'s of the same round."""
    return [value / plain for value, plain in zip(times[name], times["plain"])]


def figures(times: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    """Per variant, its median and best seconds per step; but for plain, its ratio to plain
    (median, lowest and highest of the rounds' ratios) and the ratio of the bests."""
    result = {}
    for name in VARIANTS:
        entry = {"median_s": median(list(times[name])), "best_s": min(times[name])}
        if name != "plain":
            ratios = paired_ratios(times, name)
            entry.update(ratio=statistics.median(ratios), lowest=min(ratios), highest=max(ratios),
                         ratio_of_bests=min(times[name]) / min(times["plain"]))
        result[name] = entry
    return result


def report(title: str, times: Mapping[str, Sequence[float]]) -> list[str]:
    """Each variant's median and best ms/step; but for plain, its ratio to plain (median of
    the rounds' ratios, the lowest and highest of them) and the ratio of the bests."""
    lines = [title, f"  {'variant':<12} {'median ms':>10} {'best ms':>8} {'ratio':>7} {'lowest':>7} "
                    f"{'highest':>7} {'ratio of bests':>15}"]
    for name, entry in figures(times).items():
        line = f"  {name:<12} {entry['median_s'] * 1e3:10.3f} {entry['best_s'] * 1e3:8.3f}"
        if name != "plain":
            line += (f" {entry['ratio']:7.4f} {entry['lowest']:7.4f} {entry['highest']:7.4f}"
                     f" {entry['ratio_of_bests']:15.4f}")
        lines.append(line)
    return lines


def tftrun_times(workers: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Rank 0's seconds per step of each variant under a real tftrun job."""
    with tempfile.TemporaryDirectory(prefix="bench-phase-") as tmp:
        out = Path(tmp) / "times.json"
        cmd = tftrun_cmd(workers, Path(tmp) / "logs", str(JOB), f"--out={out}",
                         f"--rounds={rounds}", f"--steps={steps}")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"tftrun exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in part 1 (tftrun gives each worker OMP_NUM_THREADS=1)")
    parser.add_argument("--tftrun_workers", type=int, default=2, help="0: skip part 3")
    parser.add_argument("--tftrun_rounds", type=int, default=10)
    parser.add_argument("--tftrun_steps", type=int, default=100)
    add_json_flag(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    listener = report_phase_listener()
    times = PhaseBench(listener, lambda model: None).rounds(args.rounds, args.steps)
    text = report(f"1. one process, {args.threads} thread(s), torch {torch.__version__}: "
                  f"{args.rounds} rounds of {args.steps} steps", times)
    added = wrapper_seconds(listener)
    text.append(f"2. the wrapper alone adds {added * 1e6:.2f} us per step = "
                f"{added / median(times['plain']) * 100:.3f}% of a plain step of part 1")
    result = {"one_process": figures(times), "wrapper_added_s": added,
              "wrapper_share_of_plain_step": added / median(times["plain"]),
              "torch": torch.__version__, "threads": args.threads, "rounds": args.rounds, "steps": args.steps}
    if args.tftrun_workers:
        tft_times = tftrun_times(args.tftrun_workers, args.tftrun_rounds, args.tftrun_steps)
        text += report(f"3. tftrun, {args.tftrun_workers} workers, rank 0: "
                       f"{args.tftrun_rounds} rounds of {args.tftrun_steps} steps", tft_times)
        result["tftrun"] = {"workers": args.tftrun_workers, "rounds": args.tftrun_rounds,
                            "steps": args.tftrun_steps, "variants": figures(tft_times)}
    text.append("target: wrapped ratio <= 1.01, or within the plain-again range (the noise band)")
    emit(result, args.json, text)


if __name__ == "__main__":
    main()
