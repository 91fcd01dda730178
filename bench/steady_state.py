"""Steady-state training speed: tftrun with its defaults against torchrun, in the same run.

    PYTHONPATH=. python bench/steady_state.py [--workers 4] [--max_steps 900] [--rounds 3] [--json]

Fault-free runs of the main job (bench/jobs/timed_mnist.py over two epochs, a checkpoint
every ``--save_steps``) under torchrun and under tftrun with its defaults, the columns
alternating round by round. Per run, the median over ranks of:

* **steps/s after start-up**: the steps completed past ``--warmup_steps`` (the first steps
  of any launcher). The steady state the target is about: at least 0.98x torchrun's;
* the job's wall time.

Each figure is the median over rounds, with each tftrun column's ratio to torchrun's.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from common import add_json_flag, emit, median, ratio
from fault_recovery import Column, Run, run_job, steady_rate

COLUMNS = (
    (Column("torchrun", "torchrun", "kill", "rollback"), ()),
    (Column("tftrun", "tftrun", "kill", "lose_nothing"), ()),
)
"""Each column, and the tftrun options it adds (``lose_nothing``: tftrun's default modes)."""
JOB_ARGS = ("--epochs=2",)
"""Two epochs of the template's 60 000 synthetic samples: 936 steps at 4 ranks."""


def figures(run: Run, warmup_steps: int) -> dict[str, float]:
    """The figures of one fault-free run."""
    return {"steps/s after start-up": steady_rate(run.steps, warmup_steps),
            "job time s": run.wall_seconds}


def table(labels: Sequence[str], medians: Mapping[str, Mapping[str, float]]) -> list[str]:
    """One line per figure: each column's value, each tftrun column's ratio to torchrun's."""
    baseline = labels[0]
    lines = [f"{'figure':<32}" + "".join(f"{label:>18}" for label in labels)]
    for name in medians[baseline]:
        line = f"{name:<32}{medians[baseline][name]:>18.2f}"
        for label in labels[1:]:
            value = medians[label][name]
            line += f"{value:>10.2f} ({ratio(value, medians[baseline][name]):4.2f})"
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=900)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=20,
                        help="left out of both rates (the first steps of any launcher)")
    parser.add_argument("--rounds", type=int, default=3)
    add_json_flag(parser)
    args = parser.parse_args()
    collected: dict[str, dict[str, list[float]]] = {c.label: {} for c, _ in COLUMNS}
    loads: list[float] = []
    for round_ in range(args.rounds):
        for column, options in COLUMNS[::-1] if round_ % 2 else COLUMNS:
            job = argparse.Namespace(**vars(args), tftrun_arg=list(options), keep_events=None)
            run = run_job(column, job, faulty=False, job_args=JOB_ARGS)
            values = figures(run, args.warmup_steps)
            loads += run.load
            print(f"round {round_ + 1} {column.label:<16} "
                  + "  ".join(f"{k} {v:.2f}" for k, v in values.items()), flush=True,
                  file=sys.stderr if args.json else sys.stdout)
            for name, value in values.items():
                collected[column.label].setdefault(name, []).append(value)
    labels = [column.label for column, _ in COLUMNS]
    medians = {label: {name: median(values) for name, values in named.items()}
               for label, named in collected.items()}
    title = (f"fault-free, {args.workers} ranks, {args.max_steps} steps, checkpoint every "
             f"{args.save_steps}; median of {args.rounds} round(s)")
    result = {"bench": "steady_state", "title": title, "args": vars(args), "medians": medians,
              "rounds": collected,
              "ratios": {label: {name: ratio(medians[label][name], medians[labels[0]][name])
                                 for name in medians[label]} for label in labels[1:]},
              "targets": {"steps/s after start-up": 0.98},
              "load_average_1min": [min(loads), max(loads)]}
    emit(result, args.json, ["", title, *table(labels, medians),
                             f"load average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f}",
                             "target: steps/s after start-up >= 0.98x torchrun's"])


if __name__ == "__main__":
    main()
