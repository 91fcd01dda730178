"""Recovery from a fault of one rank: tftrun against torchrun on the main job, in the same run.

    PYTHONPATH=. python bench/fault_recovery.py [--fault kill|uce] [--workers 4] [--fault_rank 2]
        [--fault_step 50] [--max_steps 150] [--save_steps 20] [--rounds 1] [--mode rollback]
        [--tftrun_arg ARG]... [--json]

Both launchers run the same job, bench/jobs/timed_mnist.py (the template's MLP, a
checkpoint every ``--save_steps``, each completed step logged with its time): torchrun
with ``--standalone --max_restarts=1`` (the job reloads its own newest checkpoint on the
restart; every tftrun mode off, as nothing in torchrun serves them) and tftrun with
``--rejoin_cooldown=0``. In the faulty run rank ``--fault_rank`` fails once:

* ``--fault kill``: it kills itself with SIGKILL right after completing step
  ``--fault_step``. Two columns: torchrun, and tftrun in ``--mode``.
* ``--fault uce``: step ``--fault_step`` raises a ``recovery.faults.DeviceError`` at its
  gradient all-reduce (as ``tftctl inject --fault uce`` does). Three columns: torchrun
  (the error ends the rank, torchrun restarts all), tftrun with its default modes (the
  rank is repaired in place), and tftrun after a kill -9 in ``--mode`` (the relaunch
  path) for comparison.

Reported, the median over ``--rounds`` rounds, the columns alternating, with each tftrun
column's ratio to torchrun's:

* recovery: from the fault until every rank has completed a step again;
* steps redone: the last step completed before the fault minus the step recovery
  resumed from;
* job time: wall clock of the launcher command with the fault, and without;
* steady state: steps/s of a fault-free run after ``--warmup_steps`` (median over ranks).

``--mode`` picks the tftrun recovery mode of the kill column and passes the
``--enable_tft`` that selects it (``rollback``: all off; ``replica``, ``last_words`` and
``lose_nothing`` — the default, all on — expect 0 steps redone); more tftrun options go
with ``--tftrun_arg`` (repeatable): ``--tftrun_arg=--fork_server=false`` measures the cold
relaunch (tftrun forks every relaunch from its warm fork server by default).
``--real_defaults`` drops the ``--rejoin_cooldown=0 --min_worker_num=<workers>`` the bench
otherwise gives tftrun (so the 30 s cooldown applies, and the survivors train on without
the killed rank, tftrun's default: docs/elastic.md), which may then not be back before the job ends:
recovery is then measured over the ranks that came back. Every faulty column also
reports the survivors' idle time: the longest gap between two step completions of a
survivor after the fault, less its median gap before it (the most any survivor waited).
Every tftrun column also reports the job's samples/s while it trained degraded (from the
workers' ``step`` events in ``events.jsonl``, their ``batch`` field, in the generations the
``membership`` events say had fewer than N ranks) against its fault-free run's steady
samples/s and against its own run's while it had all N ranks (which shares the faulty
run's machine load), as ratios beside (N-1)/N.
Targets (issue 16): recovery ≤ 0.3× torchrun's with the defaults, ≤ 0.1× in the best
case (``--fault_step 300 --max_steps 400``); steady-state throughput ≥ 0.98×
torchrun's, measured apart by steady_state.py. Each run's load average (1 min, before and
after it) is reported beside the figures. ``--json`` prints one JSON object instead of the table. Results:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import add_json_flag, emit, median, ratio, tftrun_cmd, torchrun_cmd
from jobs.step_log import StepRecord, read_fault_time, read_final_loss, read_steps

from recovery.env import MS_ENABLE_TFT, MS_RECOVERY_PATH
from recovery.events import read_events
from recovery.train.step_events import PAUSED

JOB = Path(__file__).resolve().parent / "jobs" / "timed_mnist.py"
MODES = {"rollback": "{TTP:0,UCE:0,ARF:0}", "replica": "{ARF:1}", "last_words": "{TTP:1}",
         "lose_nothing": "{TTP:1,UCE:1,ARF:1}"}
"""Each tftrun mode measured, and the --enable_tft value that selects it."""
# torchrun's c10d rendezvous shares its TCPStore with the workers by default, and a restarted
# group then hangs in init_process_group on the previous attempt's keys (pytorch#135712,
# still so in torch 2.13): give each attempt its own store, as torch's issue advises.
# The job runs as a plain torchrun job: with UCE on, the library would repair a device
# error in place even without tftrun.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", MS_ENABLE_TFT: MODES["rollback"]}


@dataclass(frozen=True)
class Column:
    """One column of the table: a launcher, the fault its job suffers, the tftrun mode."""

    label: str
    system: str
    fault: str
    mode: str

    def redone_target(self, save_steps: int) -> str:
        return f"<= {save_steps}" if self.mode == "rollback" else "0"


def columns(fault: str, mode: str) -> list[Column]:
    """What one invocation measures; torchrun's column, the baseline, comes first."""
    baseline = Column("torchrun", "torchrun", fault, "rollback")
    relaunch = Column(f"tftrun {mode}", "tftrun", "kill", mode)
    if fault == "kill":
        return [baseline, relaunch]
    return [baseline, Column("tftrun in place", "tftrun", "uce", "lose_nothing"),
            Column(f"tftrun kill -9, {mode}", "tftrun", "kill", mode)]


@dataclass(frozen=True)
class Recovery:
    seconds: float
    steps_redone: int


def survivors_idle(steps: Mapping[int, Sequence[StepRecord]], fault_rank: int,
                   fault_at: float) -> float:
    """The most any rank but ``fault_rank`` waited beyond a normal step after the fault:
    its longest gap between two step completions from its last one before the fault on,
    less its median gap before the fault (seconds)."""
    idle = []
    for rank, records in steps.items():
        if rank == fault_rank:
            continue
        before = [r.time for r in records if r.time <= fault_at]
        after = [r.time for r in records if r.time > fault_at]
        if len(before) < 2 or not after:
            continue
        normal = median([b - a for a, b in zip(before, before[1:])])
        times = [before[-1], *after]
        idle.append(max(b - a for a, b in zip(times, times[1:])) - normal)
    return max(idle)


def recovery(steps: Mapping[int, Sequence[StepRecord]], fault_at: float,
             may_stay_out: int | None = None) -> Recovery:
    """Time from the fault until every rank completed a step again, and the steps redone.

    A rank's first step after recovery is its first one logged after the fault that could
    not have completed in the old group: beyond the last step completed before the fault,
    or by another process, or not following its previous step. A survivor that logs the
    step it had in flight a moment after the fault (a straggler) does not count. Rank
    ``may_stay_out`` (the failed one, when the others train on without it) is left out
    if it completed no step after the fault.
    """
    last_before = max(r.step for records in steps.values() for r in records if r.time <= fault_at)
    resumed = {}
    for rank, records in steps.items():
        previous = None
        for record in records:
            if record.time > fault_at and (
                    previous is None or record.step > last_before or record.pid != previous.pid
                    or record.step != previous.step + 1):
                resumed[rank] = record
                break
            previous = record
        else:
            if rank == may_stay_out:
                continue
            raise ValueError(f"rank {rank} never completed a step after the fault")
    return Recovery(seconds=max(r.time for r in resumed.values()) - fault_at,
                    steps_redone=last_before - (min(r.step for r in resumed.values()) - 1))


def steady_rate(steps: Mapping[int, Sequence[StepRecord]], warmup_steps: int) -> float:
    """Steps per second after ``warmup_steps``: the median over ranks, each from its first to its last step counted (a
    fault-free run: one process per rank)."""
    rates = []
    for records in steps.values():
        timed = [r for r in records if r.step > warmup_steps]
        if len(timed) >= 2:
            rates.append((timed[-1].step - timed[0].step) / (timed[-1].time - timed[0].time))
    return median(rates)


Event = Mapping[str, Any]


def samples_per_second(events: Sequence[Event], keep: Callable[[Event], bool]) -> float:
    """The job's samples/s over the workers' ``step`` events that ``keep`` accepts.

    Per rank, each two consecutive kept events of one generation, neither ``paused`` (a
    speed is never measured across a fault), count the steps between them times the later
    one's ``batch`` (the job-wide samples of the steps since the earlier one: one
    generation trains one batch) over the time between them; the median over ranks (the
    active ranks train the same steps), NaN when no rank has two such events.
    """
    by_rank: dict[int, list[Event]] = defaultdict(list)
    for event in events:
        if event.get("event") == "step" and keep(event):
            by_rank[event["rank"]].append(event)
    rates = []
    for steps in by_rank.values():
        samples = seconds = 0.0
        for a, b in zip(steps, steps[1:]):
            if PAUSED in (a["why"], b["why"]) or a["generation"] != b["generation"] \
                    or b["batch"] is None:
                continue
            samples += (b["step"] - a["step"]) * b["batch"]
            seconds += b["ts"] - a["ts"]
        if seconds > 0:
            rates.append(samples / seconds)
    return median(rates)


def degraded_generations(events: Sequence[Event], workers: int) -> set[int]:
    """The generations that trained with fewer than ``workers`` ranks (``membership``
    events: from a ``shrink`` until the next generation)."""
    return {e["generation"] for e in events
            if e.get("event") == "membership" and e["world"] < workers}


DEGRADED, FAULT_FREE, WHOLE = "samples/s degraded", "samples/s fault-free", "samples/s whole"
"""The samples/s of the job while degraded, of its fault-free run past the warm-up, and of
the faulty run itself while it had every rank (past the warm-up): machine load drifts
between two runs, and the same run's stretch at N ranks shares its load."""
BY_FAULT_FREE, BY_WHOLE = "degraded / fault-free samples/s", "degraded / whole samples/s"
"""The ratios of :data:`DEGRADED` to the other two."""


def degraded_samples(faulty: Sequence[Event], clean: Sequence[Event], workers: int,
                     warmup_steps: int) -> dict[str, float]:
    """:data:`DEGRADED`, :data:`FAULT_FREE` and :data:`WHOLE` from the two runs' events,
    and the first's ratio to each other (NaN without a degraded stretch)."""
    degraded = degraded_generations(faulty, workers)
    while_degraded = samples_per_second(faulty, lambda e: e["generation"] in degraded)
    steady = samples_per_second(clean, lambda e: e["step"] > warmup_steps)
    whole = samples_per_second(faulty, lambda e: e["generation"] not in degraded
                               and e["step"] > warmup_steps)
    return {DEGRADED: while_degraded, FAULT_FREE: steady, WHOLE: whole,
            BY_FAULT_FREE: ratio(while_degraded, steady),
            BY_WHOLE: ratio(while_degraded, whole)}


MILESTONES = ("spawn", "register", "generation", "rollback")
"""The relaunched rank's way back in events.jsonl: its process (``forked`` by the fork server),
its registration with the scheduler, the generation formed with it, the state restored."""


def where_the_time_goes(events_file: Path, fault_rank: int, fault_at: float) -> dict[str, float]:
    """Seconds from the fault to the first of each milestone after it (NaN when absent)."""
    found: dict[str, float] = {}
    for line in events_file.read_text().splitlines():
        record = json.loads(line)
        name, ts = record.get("event"), float(record.get("ts", 0.0))
        if ts < fault_at or name not in MILESTONES or name in found:
            continue
        if name in ("spawn", "register") and record.get("rank") != fault_rank:
            continue
        if name == "spawn" and record.get("role") != "worker":
            continue
        found[name] = ts - fault_at
        if name == "spawn":
            found["forked"] = 1.0 if record.get("forked") else 0.0
    return {f"{name} s": found.get(name, float("nan")) for name in MILESTONES} | {
        "forked": found.get("forked", float("nan"))}


@dataclass(frozen=True)
class Run:
    wall_seconds: float
    steps: dict[int, list[StepRecord]]
    fault_at: float | None
    load: tuple[float, float]
    """The 1-minute load average before and after the run: how quiet the machine was."""
    milestones: dict[str, float]
    """tftrun's faulty runs: :func:`where_the_time_goes`; empty otherwise."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """tftrun: its ``events.jsonl``; empty for torchrun."""
    loss: float = math.nan
    """Rank 0's final loss over the first samples (jobs/timed_mnist.py); NaN if it wrote none."""


def run_job(column: Column, args: argparse.Namespace, faulty: bool,
            job_args: Sequence[str] = ()) -> Run:
    """One run of the job as ``column`` says (with its fault or without), in a fresh folder;
    ``job_args`` go to the job (the template) as they are."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{column.system}-") as tmp:
        timing = Path(tmp) / "steps"
        job = [str(JOB), f"--timing_dir={timing}", f"--max_steps={args.max_steps}",
               f"--save_steps={args.save_steps}", *job_args]
        if faulty:
            job += [f"--fault={column.fault}", f"--fault_rank={args.fault_rank}",
                    f"--fault_step={args.fault_step}"]
        env = dict(os.environ)
        if column.system == "tftrun":
            cmd = tftrun_cmd(args.workers, Path(tmp) / "logs", *job, extra=(
                *_pinned(args), f"--recovery_path={Path(tmp) / 'recovery'}",
                f"--enable_tft={MODES[column.mode]}", *args.tftrun_arg))
        else:
            cmd = torchrun_cmd(args.workers, Path(tmp) / "logs", *job,
                               extra=("--standalone", "--max_restarts=1"))
            env.update(TORCHRUN_ENV, **{MS_RECOVERY_PATH: str(Path(tmp) / "recovery")})
        load_before = os.getloadavg()[0]
        started = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        wall = time.time() - started
        if args.keep_events and faulty and column.system == "tftrun":
            args.keep_events.mkdir(parents=True, exist_ok=True)
            kept = args.keep_events / f"{column.mode}-{int(started)}.jsonl"
            shutil.copyfile(Path(tmp) / "logs" / "events.jsonl", kept)
        if done.returncode != 0:
            raise RuntimeError(f"{column.label} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        steps = read_steps(timing)
        # The failed rank of a job that trains on without it may end before it is back.
        if sorted(steps) != list(range(args.workers)) or any(
                records[-1].step != args.max_steps for rank, records in steps.items()
                if not (faulty and rank == args.fault_rank)):
            raise RuntimeError(f"{column.label}: not every rank reached step {args.max_steps}")
        fault_at = read_fault_time(timing) if faulty else None
        milestones = (where_the_time_goes(Path(tmp) / "logs" / "events.jsonl", args.fault_rank,
                                          fault_at)
                      if fault_at is not None and column.system == "tftrun" else {})
        return Run(wall, steps, fault_at, (load_before, os.getloadavg()[0]), milestones,
                   list(read_events(Path(tmp) / "logs")) if column.system == "tftrun" else [],
                   read_final_loss(timing))


def measure(column: Column, args: argparse.Namespace, clean: Run) -> dict[str, float]:
    """The figures of one faulty run of ``column``, and of its launcher's fault-free ``clean`` run."""
    faulty = run_job(column, args, faulty=True)
    assert faulty.fault_at is not None
    measured = recovery(faulty.steps, faulty.fault_at, may_stay_out=args.fault_rank)
    return {"recovery s": measured.seconds, "steps redone": measured.steps_redone,
            "survivors idle s": survivors_idle(faulty.steps, args.fault_rank, faulty.fault_at),
            "job time with the fault s": faulty.wall_seconds,
            "job time without s": clean.wall_seconds,
            "steady-state steps/s": steady_rate(clean.steps, args.warmup_steps),
            "load min": min(*faulty.load, *clean.load),
            "load max": max(*faulty.load, *clean.load),
            **{f"after the fault: {name}": value for name, value in faulty.milestones.items()},
            **(degraded_samples(faulty.events, clean.events, args.workers, args.warmup_steps)
               if column.system == "tftrun" else {})}


def _pinned(args: argparse.Namespace) -> tuple[str, ...]:
    """What the bench gives tftrun unless ``--real_defaults``: no cooldown, and the
    recovery mode measured alone (``--min_worker_num`` equal to the job's size, so the
    survivors wait for the relaunched rank rather than train degraded, tftrun's default),
    unless a ``--tftrun_arg`` names ``--min_worker_num``."""
    if args.real_defaults:
        return ()
    named = any(arg.startswith("--min_worker_num") for arg in args.tftrun_arg)
    return ("--rejoin_cooldown=0", *(() if named else (f"--min_worker_num={args.workers}",)))


def table(measured: Sequence[Column], figures: Mapping[str, Mapping[str, float]],
          targets: Mapping[str, str]) -> list[str]:
    """One line per figure: each column's value, and each tftrun column's ratio to the first."""
    baseline = measured[0].label
    widths = [max(len(column.label), 9) + 2 for column in measured]
    lines = [f"{'figure':<26}" + "".join(
        f"{c.label:>{w}}" + ("" if c.label == baseline else "  ratio") for c, w in zip(measured, widths))
        + "  target"]
    for name, target in targets.items():
        line = f"{name:<26}"
        for column, width in zip(measured, widths):
            value = figures[column.label][name]
            line += f"{value:>{width}.3f}"
            if column.label != baseline:
                line += f"{ratio(value, figures[baseline][name]):>7.2f}"
        lines.append(f"{line}  {target}")
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=("kill", "uce"), default="kill")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fault_rank", type=int, default=2)
    parser.add_argument("--fault_step", type=int, default=50,
                        help="kill: the rank dies right after completing it; uce: raised inside it")
    parser.add_argument("--max_steps", type=int, default=150)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=20, help="left out of the steady-state rate")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mode", choices=MODES, default="rollback",
                        help="the tftrun recovery mode measured after a kill")
    parser.add_argument("--tftrun_arg", action="append", default=[],
                        help="an extra tftrun option, e.g. --tftrun_arg=--heartbeat_timeout=10 (repeatable)")
    parser.add_argument("--real_defaults", action="store_true",
                        help="give tftrun no --rejoin_cooldown=0: its 30 s cooldown applies")
    parser.add_argument("--keep_events", type=Path, default=None,
                        help="copy each faulty tftrun run's events.jsonl into this folder "
                             "(to see where its recovery time went)")
    add_json_flag(parser)
    args = parser.parse_args()
    if not 0 <= args.fault_rank < args.workers or not args.warmup_steps < args.fault_step < args.max_steps:
        parser.error("need 0 <= fault_rank < workers and warmup_steps < fault_step < max_steps")
    return args


def main() -> None:
    args = parse_args()
    measured = columns(args.fault, args.mode)
    figures: dict[str, dict[str, list[float]]] = {column.label: {} for column in measured}
    for round_ in range(args.rounds):
        clean: dict[tuple[str, str], Run] = {}
        # Alternate who goes first, so that drifting machine load hits all alike.
        for column in measured[::-1] if round_ % 2 else measured:
            key = (column.system, column.mode)
            if key not in clean:
                clean[key] = run_job(column, args, faulty=False)
            values = measure(column, args, clean[key])
            print(f"round {round_ + 1} {column.label:<22} "
                  + "  ".join(f"{k} {v:.3f}" for k, v in values.items()), flush=True,
                  file=sys.stderr if args.json else sys.stdout)
            for name, value in values.items():
                figures[column.label].setdefault(name, []).append(value)
    targets = {"recovery s": "<= 0.3", "survivors idle s": "<= 1 s",
               "steps redone": ", ".join(f"{c.label} {c.redone_target(args.save_steps)}" for c in measured[1:]),
               "job time with the fault s": "-", "job time without s": "-",
               "steady-state steps/s": ">= 0.98"}
    title = (f"{args.fault} of rank {args.fault_rank} of {args.workers} "
             f"{'after' if args.fault == 'kill' else 'at'} step {args.fault_step}, {args.max_steps} steps, "
             f"checkpoint every {args.save_steps}, tftrun mode after a kill: {args.mode}"
             f"{' ' + ' '.join(args.tftrun_arg) if args.tftrun_arg else ''}"
             f"{''.join(' ' + option for option in _pinned(args))}; median of {args.rounds} round(s)")
    medians = {label: {name: median(values) for name, values in named.items()}
               for label, named in figures.items()}
    whole = (args.workers - 1) / args.workers
    degraded = {c.label: {name: value for name, value in medians[c.label].items()
                          if name.startswith(("samples/s", "degraded /"))} | {"(N-1)/N": whole}
                for c in measured if c.system == "tftrun"}
    loads = [v for named in figures.values() for k in ("load min", "load max") for v in named[k]]
    baseline = measured[0].label
    result = {"bench": "fault_recovery", "title": title, "args": vars(args),
              "medians": medians, "rounds": figures,
              "ratios": {c.label: {name: ratio(medians[c.label][name], medians[baseline][name])
                                   for name in targets} for c in measured[1:]},
              "targets": {"recovery s": 0.3, "steady-state steps/s": 0.98},
              "samples_while_degraded": degraded,
              "load_average_1min": [min(loads), max(loads)]}
    where = [f"{c.label}: after the fault, median s: " + ", ".join(
        f"{name.removeprefix('after the fault: ')} {value:.3f}"
        for name, value in medians[c.label].items() if name.startswith("after the fault"))
        for c in measured[1:]]
    load_line = f"load average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f}"
    emit(result, args.json, ["", title, *table(measured, medians, targets), *where,
                             *degraded_lines(degraded), load_line])


def degraded_lines(degraded: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Each tftrun column's samples/s while degraded against its fault-free run's and its
    own run's at N ranks, beside (N-1)/N: the survivors' rate if each trained at its normal
    speed (with the constant global batch a degraded step is N/W times a share's work)."""
    return [f"{label}: samples/s while degraded {d[DEGRADED]:.1f}; against fault-free "
            f"{d[FAULT_FREE]:.1f}: {d[BY_FAULT_FREE]:.2f}x; against the same run "
            f"at N ranks {d[WHOLE]:.1f}: {d[BY_WHOLE]:.2f}x; (N-1)/N = {d['(N-1)/N']:.2f}"
            if math.isfinite(d[DEGRADED]) else f"{label}: never trained degraded"
            for label, d in degraded.items()]


if __name__ == "__main__":
    main()
