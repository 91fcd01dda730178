"""A rank slowed down: torchrun, tftrun that reports it, tftrun that evicts it; and the detector's cost.

    PYTHONPATH=. python3 bench/straggler.py [--workers 4] [--slow_rank 2] [--factor 3]
        [--slow_at 100] [--max_steps 600] [--save_steps 100] [--warmup_steps 20]
        [--overhead_rounds 3] [--tftrun_arg ARG]... [--json]

The main job (bench/jobs/timed_mnist.py, as bench/fault_recovery.py runs it: each completed
step logged with its time) on ``--workers`` ranks, rank ``--slow_rank`` made ``--factor``
times slower from step ``--slow_at`` of ``--max_steps`` (the job hands the trainer the
``slow`` injection ``tftctl inject --fault slow`` would, so that torchrun's run is slowed
alike). The runs:

* **torchrun** (``--standalone --max_restarts=1``) and **tftrun, report**
  (``--straggler_policy=report``, the default), slowed: ``after_ratio``, the job's
  steps/s after the slow-down over its steps/s before;
* **tftrun, evict** (``--straggler_policy=evict``), slowed: ``steps_to_recover``, the
  steps from the slow-down until a :data:`SPAN`-step stretch from the eviction on runs at
  least 0.9x the rate before it (target ≤ 30; ``evicted_at_step``: the step of the
  eviction); ``after_ratio``, the rate from there to the end over the rate
  before; ``job_ratio``, the job's wall time over the fault-free run's (target ≤ 1.15);
  ``final_loss_rel_diff``, rank 0's final loss over the first 2 000 samples against the
  fault-free run's (target ≤ 1e-4, the degraded runs' tolerance: docs/elastic.md);
* **tftrun, fault-free**, with the detector and **without it** (the ranks send no compute
  times; their step clocks still run), ``--overhead_rounds`` runs each, alternating:
  ``detector_overhead``, the median steady steps/s (past ``--warmup_steps``) without over
  the median with (target ≤ 1.01); the first run with it is the fault-free run above.
  The machine's noise is larger than 1 %: ``detector_step_us`` times what the detector adds
  to a step on its own (the step clock's marks, the time handed to the heartbeat), and
  ``detector_cost_ratio`` is 1 plus that over the fault-free step.

The rates are the median over the ranks other than the slowed one. tftrun runs with its
defaults (the 30 s cooldown, ``--min_worker_num`` 1: the survivors of an eviction train
on degraded at once) plus ``--tftrun_arg`` options, e.g. ``--tftrun_arg=--heartbeat_timeout=5``
for beats (and so step-time summaries) every second instead of every 6 s. ``--json``
prints, as its last line, ``{"report": {"after_ratio": float}, "evict": {"after_ratio":
float, "steps_to_recover": int, "job_ratio": float}, "torchrun": {"after_ratio": float},
"detector_overhead": float}`` and more keys. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Mapping, Sequence
from typing import Any

from common import absolute_pythonpath, add_json_flag, emit, median, ratio
from fault_recovery import Column, Run, run_job, steady_rate
from jobs.step_log import StepRecord

from recovery.control.stragglers import StepTimes
from recovery.train.compute_clock import ComputeClock

SPAN = 20
"""Steps over which a rate after the slow-down is taken (the detector's default window)."""
RECOVERED = 0.9
"""The share of the rate before the slow-down that counts as recovered."""
EPOCHS = ("--epochs=100",)
"""Enough epochs of the template's data for any ``--max_steps``: the job ends there."""

Steps = Mapping[int, Sequence[StepRecord]]


def rate(records: Sequence[StepRecord], first: int, last: int) -> float:
    """Steps per second of one rank from completing step ``first`` to completing ``last``
    (a step logged twice, by a relaunch, at its later time); NaN without both."""
    times = {r.step: r.time for r in records}
    if first not in times or last not in times or last <= first:
        return float("nan")
    return (last - first) / (times[last] - times[first])


def survivors_rate(steps: Steps, slow_rank: int, first: int, last: int) -> float:
    """The median over the ranks but ``slow_rank`` of :func:`rate`."""
    return median([value for rank, records in steps.items() if rank != slow_rank
                   if (value := rate(records, first, last)) == value])


def steps_to_recover(steps: Steps, slow_rank: int, slow_at: int, evicted_at: int,
                     before: float) -> int | None:
    """The steps from ``slow_at`` until the survivors, from the step they had completed at
    the eviction (``evicted_at``) on, run :data:`SPAN` steps at :data:`RECOVERED` times
    ``before`` or faster; None when they never do. A fast stretch before the eviction is
    the machine's noise: the straggler still holds every step back."""
    last = min(records[-1].step for rank, records in steps.items() if rank != slow_rank)
    for start in range(max(slow_at, evicted_at), last - SPAN + 1):
        if survivors_rate(steps, slow_rank, start, start + SPAN) >= RECOVERED * before:
            return start - slow_at
    return None


def slowed(run: Run, args: argparse.Namespace, evicted_at: int | None = None) -> dict[str, Any]:
    """The figures of a slowed run: the rates before and after; for a run that evicts
    (``evicted_at``: the survivors' step then, -1 when it did not evict), the steps it took
    to recover (the rate after is then taken from there)."""
    before = survivors_rate(run.steps, args.slow_rank, args.warmup_steps, args.slow_at)
    figures: dict[str, Any] = {"rate_before": before, "wall_s": run.wall_seconds,
                               "load": list(run.load)}
    start = args.slow_at
    if evicted_at is not None:
        recovered = None if evicted_at < 0 else steps_to_recover(
            run.steps, args.slow_rank, args.slow_at, evicted_at, before)
        figures["recovered"] = recovered is not None
        figures["steps_to_recover"] = args.max_steps - args.slow_at if recovered is None else recovered
        start += figures["steps_to_recover"]
    after = survivors_rate(run.steps, args.slow_rank, start, args.max_steps)
    return figures | {"rate_after": after, "after_ratio": ratio(after, before)}


def detected(run: Run, slow_rank: int) -> dict[str, Any]:
    """From a tftrun run's events: seconds from the slow-down until the slowed rank was
    named (NaN: never), the ranks named, the step a survivor had completed when the slowed
    rank was evicted (None: it was not), and the evictions (``verdict: straggler``)."""
    assert run.fault_at is not None
    named = [e for e in run.events if e.get("event") == "straggler"]
    first = next((e["ts"] for e in named if e["rank"] == slow_rank and e["ts"] >= run.fault_at),
                 float("nan"))
    evicted_at = next((e["ts"] for e in run.events if e.get("event") == "verdict"
                       and e.get("verdict") == "straggler" and e["rank"] == slow_rank), None)
    survivor = next(records for rank, records in sorted(run.steps.items()) if rank != slow_rank)
    return {"named_after_s": first - run.fault_at, "named": [e["rank"] for e in named],
            "evicted_at_step": None if evicted_at is None else max(
                (r.step for r in survivor if r.time <= evicted_at), default=None),
            "evicted": [e["rank"] for e in run.events
                        if e.get("event") == "verdict" and e.get("verdict") == "straggler"]}


def detector_step_seconds(number: int = 100_000, repeat: int = 5) -> float:
    """What the detector adds to a rank's step on its own (seconds): the step clock's marks
    and the compute time handed to the heartbeat, as the trainer makes them; the best of
    ``repeat`` timings, as ``timeit`` advises."""
    clock, times = ComputeClock(), StepTimes()

    def step() -> None:
        clock.start()
        clock.collective_started()
        clock.collective_ended()
        times.add(clock.finished())

    return min(timeit.repeat(step, setup=times.take, number=number, repeat=repeat)) / number


def options(args: argparse.Namespace, fault_free: bool, *tftrun: str) -> argparse.Namespace:
    """What :func:`fault_recovery.run_job` reads: this bench's job, slowed or not, and a
    column's tftrun options."""
    return argparse.Namespace(
        workers=args.workers, max_steps=args.max_steps, save_steps=args.save_steps,
        fault_rank=-1 if fault_free else args.slow_rank, fault_step=args.slow_at,
        tftrun_arg=[*tftrun, *args.tftrun_arg], real_defaults=True, keep_events=None)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The runs, and their figures."""
    torchrun = Column("torchrun", "torchrun", "slow", "rollback")
    tftrun = Column("tftrun", "tftrun", "slow", "lose_nothing")
    factor = (*EPOCHS, f"--fault_factor={args.factor}")

    def run(column: Column, fault_free: bool, *tftrun_args: str, job: tuple[str, ...] = factor) -> Run:
        print(f"straggler: {column.label} {' '.join(tftrun_args) or '(no options)'}"
              f"{' fault-free' if fault_free else ''} {' '.join(job)}", file=sys.stderr, flush=True)
        return run_job(column, options(args, fault_free, *tftrun_args), not fault_free, job)

    clean = run(tftrun, True)
    evict = run(tftrun, False, "--straggler_policy=evict")
    report = run(tftrun, False, "--straggler_policy=report")
    torch = run(torchrun, False)
    # Alternate the fault-free runs with and without the detector: drifting load hits both.
    cleans, blinds = [clean], []
    for round_ in range(args.overhead_rounds):
        blinds.append(run(tftrun, True, job=(*EPOCHS, "--no_step_times")))
        if round_ < args.overhead_rounds - 1:
            cleans.append(run(tftrun, True))
    return figures(args, cleans, blinds, evict=evict, report=report, torch=torch)


def figures(args: argparse.Namespace, cleans: Sequence[Run], blinds: Sequence[Run], *,
            evict: Run, report: Run, torch: Run) -> dict[str, Any]:
    """The bench's result from its runs: fault-free with the detector (the first is the
    baseline of the evict run) and without it, and the three slowed runs."""
    clean = cleans[0]
    found = detected(evict, args.slow_rank)
    evicted = slowed(evict, args, -1 if found["evicted_at_step"] is None
                     else found["evicted_at_step"]) | found
    evicted["job_ratio"] = ratio(evict.wall_seconds, clean.wall_seconds)
    evicted["final_loss_rel_diff"] = abs(evict.loss - clean.loss) / clean.loss
    with_detector = median([steady_rate(r.steps, args.warmup_steps) for r in cleans])
    without = median([steady_rate(r.steps, args.warmup_steps) for r in blinds])
    cost = detector_step_seconds()
    loads = [load for measured in (*cleans, evict, report, torch, *blinds) for load in measured.load]
    return {"report": slowed(report, args) | detected(report, args.slow_rank),
            "evict": evicted, "torchrun": slowed(torch, args),
            "detector_overhead": ratio(without, with_detector),
            "detector_step_us": cost * 1e6, "detector_cost_ratio": 1 + cost * with_detector,
            "fault_free": {"rate_with_detector": with_detector, "rate_without": without,
                           "wall_s": clean.wall_seconds},
            "load_average_1min": [min(loads), max(loads)], "args": vars(args)}


def text(result: Mapping[str, Any], args: argparse.Namespace) -> list[str]:
    evict, free = result["evict"], result["fault_free"]
    lines = [f"rank {args.slow_rank} of {args.workers} {args.factor:g}x slower from step "
             f"{args.slow_at} of {args.max_steps}; tftrun {' '.join(args.tftrun_arg) or 'defaults'}"]
    for name in ("torchrun", "report", "evict"):
        measured = result[name]
        lines.append(f"{name:<9} steps/s before {measured['rate_before']:7.2f}  after "
                     f"{measured['rate_after']:7.2f}  ratio {measured['after_ratio']:5.2f}"
                     f"  job {measured['wall_s']:6.1f} s" + ("" if name == "torchrun" else
                     f"  named {measured['named_after_s']:.1f} s after the slow-down; ranks "
                     f"named {measured['named']}, evicted {measured['evicted']}"))
    lines += [f"evict: evicted at step {evict['evicted_at_step']}; back to {RECOVERED}x "
              f"within {evict['steps_to_recover']} steps "
              f"(target <= 30){'' if evict['recovered'] else ' (never: the rest of the run)'}; "
              f"job time {evict['job_ratio']:.2f}x the fault-free run's {free['wall_s']:.1f} s "
              f"(target <= 1.15); final loss rel. diff {evict['final_loss_rel_diff']:.2g} "
              f"(target <= 1e-4)",
              f"detector: fault-free steps/s {free['rate_with_detector']:.2f} with, "
              f"{free['rate_without']:.2f} without (median of {args.overhead_rounds} runs "
              f"each): {result['detector_overhead']:.3f}x (target <= 1.01); on its own "
              f"{result['detector_step_us']:.2f} us a step: {result['detector_cost_ratio']:.5f}x",
              "load average (1 min) during the runs: {:.1f}-{:.1f}".format(*result["load_average_1min"])]
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slow_rank", type=int, default=2)
    parser.add_argument("--factor", type=float, default=3.0, help="how many times slower")
    parser.add_argument("--slow_at", type=int, default=100, help="the step the slow-down starts at")
    parser.add_argument("--max_steps", type=int, default=600)
    parser.add_argument("--save_steps", type=int, default=100)
    parser.add_argument("--warmup_steps", type=int, default=20,
                        help="left out of the rates before the slow-down and fault-free")
    parser.add_argument("--overhead_rounds", type=int, default=3,
                        help="fault-free runs with the detector, and as many without (default 3)")
    parser.add_argument("--tftrun_arg", action="append", default=[],
                        help="an extra tftrun option for every tftrun run (repeatable)")
    add_json_flag(parser)
    args = parser.parse_args()
    if not 0 <= args.slow_rank < args.workers or not args.factor > 1 \
            or not args.warmup_steps < args.slow_at < args.max_steps - SPAN \
            or args.overhead_rounds < 1:
        parser.error(f"need 0 <= slow_rank < workers, factor > 1, "
                     f"warmup_steps < slow_at < max_steps - {SPAN} and overhead_rounds >= 1")
    return args


def main() -> None:
    args = parse_args()
    absolute_pythonpath()
    result = measure(args)
    emit(result, args.json, text(result, args))


if __name__ == "__main__":
    main()
