"""Recovery from kill -9 of one rank: tftrun against torchrun on the main job, in the same run.

    PYTHONPATH=. python bench/fault_recovery.py [--workers 4] [--kill_rank 2] [--kill_step 50]
        [--max_steps 150] [--save_steps 20] [--rounds 1] [--mode rollback] [--tftrun_arg ARG]...

Both launchers run the same job, bench/jobs/timed_mnist.py (the template's MLP, a
checkpoint every ``--save_steps``, each completed step logged with its time): torchrun
with ``--standalone --max_restarts=1`` (the job reloads its own newest checkpoint on the
restart) and tftrun with ``--rejoin_cooldown=0``. In the faulty run rank ``--kill_rank``
kills itself with SIGKILL right after completing step ``--kill_step`` (once). Reported,
the median over ``--rounds`` rounds, the launchers alternating:

* recovery: from the kill until every rank has completed a step again;
* steps redone: the last step completed before the kill minus the step recovery
  resumed from;
* job time: wall clock of the launcher command with the fault, and without;
* steady state: steps/s of a fault-free run after ``--warmup_steps`` (median over ranks).

``--mode`` picks the tftrun recovery mode measured and passes the ``--enable_tft`` that
selects it (``rollback``: all off; ``replica``, ``last_words`` and ``lose_nothing`` — the
default, all on — expect 0 steps redone); more tftrun options go with ``--tftrun_arg``
(repeatable). Targets
(DESIGN.md §7): recovery ≤ 0.3× torchrun's; steady-state throughput ≥ 0.98× torchrun's.
Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import median, ratio_line, tftrun_cmd, torchrun_cmd
from jobs.step_log import StepRecord, read_kill_time, read_steps

from recovery.env import MS_RECOVERY_PATH

JOB = Path(__file__).resolve().parent / "jobs" / "timed_mnist.py"
SYSTEMS = ("torchrun", "tftrun")
MODES = {"rollback": "{TTP:0,UCE:0,ARF:0}", "replica": "{ARF:1}", "last_words": "{TTP:1}",
         "lose_nothing": "{TTP:1,UCE:1,ARF:1}"}
"""Each tftrun mode measured, and the --enable_tft value that selects it."""
# torchrun's c10d rendezvous shares its TCPStore with the workers by default, and a restarted
# group then hangs in init_process_group on the previous attempt's keys (pytorch#135712,
# still so in torch 2.13): give each attempt its own store, as torch's issue advises.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Recovery:
    seconds: float
    steps_redone: int


def recovery(steps: Mapping[int, Sequence[StepRecord]], killed_at: float) -> Recovery:
    """Time from the kill until every rank completed a step again, and the steps redone.

    A rank's first step after recovery is its first one logged after the kill that could
    not have completed in the old group: beyond the last step completed before the kill,
    or by another process, or not following its previous step. A survivor that logs the
    step it had in flight a moment after the kill (a straggler) does not count.
    """
    last_before = max(r.step for records in steps.values() for r in records if r.time <= killed_at)
    resumed = {}
    for rank, records in steps.items():
        previous = None
        for record in records:
            if record.time > killed_at and (
                    previous is None or record.step > last_before or record.pid != previous.pid
                    or record.step != previous.step + 1):
                resumed[rank] = record
                break
            previous = record
        else:
            raise ValueError(f"rank {rank} never completed a step after the kill")
    return Recovery(seconds=max(r.time for r in resumed.values()) - killed_at,
                    steps_redone=last_before - (min(r.step for r in resumed.values()) - 1))


def steady_rate(steps: Mapping[int, Sequence[StepRecord]], warmup_steps: int) -> float:
    """Steps per second after ``warmup_steps``: the median over ranks, each from its first
    to its last logged step (a fault-free run: one process per rank)."""
    rates = []
    for records in steps.values():
        timed = [r for r in records if r.step > warmup_steps]
        if len(timed) >= 2:
            rates.append((timed[-1].step - timed[0].step) / (timed[-1].time - timed[0].time))
    return median(rates)


@dataclass(frozen=True)
class Run:
    wall_seconds: float
    steps: dict[int, list[StepRecord]]
    killed_at: float | None


def run_job(system: str, args: argparse.Namespace, kill: bool) -> Run:
    """One run of the job under ``system``, in a fresh temporary folder."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{system}-") as tmp:
        timing = Path(tmp) / "steps"
        job = [str(JOB), f"--timing_dir={timing}", f"--max_steps={args.max_steps}",
               f"--save_steps={args.save_steps}"]
        if kill:
            job += [f"--kill_rank={args.kill_rank}", f"--kill_step={args.kill_step}"]
        env = dict(os.environ)
        if system == "tftrun":
            cmd = tftrun_cmd(args.workers, Path(tmp) / "logs", *job, extra=(
                "--rejoin_cooldown=0", f"--recovery_path={Path(tmp) / 'recovery'}",
                f"--enable_tft={MODES[args.mode]}", *args.tftrun_arg))
        else:
            cmd = torchrun_cmd(args.workers, Path(tmp) / "logs", *job,
                               extra=("--standalone", "--max_restarts=1"))
            env.update(TORCHRUN_ENV, **{MS_RECOVERY_PATH: str(Path(tmp) / "recovery")})
        started = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        wall = time.time() - started
        if done.returncode != 0:
            raise RuntimeError(f"{system} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        steps = read_steps(timing)
        if sorted(steps) != list(range(args.workers)) or any(
                records[-1].step != args.max_steps for records in steps.values()):
            raise RuntimeError(f"{system}: not every rank reached step {args.max_steps}")
        return Run(wall, steps, read_kill_time(timing) if kill else None)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill_rank", type=int, default=2)
    parser.add_argument("--kill_step", type=int, default=50, help="the rank dies right after completing it")
    parser.add_argument("--max_steps", type=int, default=150)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--warmup_steps", type=int, default=20, help="left out of the steady-state rate")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mode", choices=MODES, default="rollback", help="the tftrun recovery mode measured")
    parser.add_argument("--tftrun_arg", action="append", default=[],
                        help="an extra tftrun option, e.g. --tftrun_arg=--enable_tft={ARF:1} (repeatable)")
    args = parser.parse_args()
    if not 0 <= args.kill_rank < args.workers or not args.warmup_steps < args.kill_step < args.max_steps:
        parser.error("need 0 <= kill_rank < workers and warmup_steps < kill_step < max_steps")
    return args


def main() -> None:
    args = parse_args()
    figures: dict[str, dict[str, list[float]]] = {system: {} for system in SYSTEMS}
    for round_ in range(args.rounds):
        # Alternate who goes first, so that drifting machine load hits both alike.
        for system in SYSTEMS[::-1] if round_ % 2 else SYSTEMS:
            faulty, clean = run_job(system, args, kill=True), run_job(system, args, kill=False)
            assert faulty.killed_at is not None
            measured = recovery(faulty.steps, faulty.killed_at)
            values = {"recovery s": measured.seconds, "steps redone": measured.steps_redone,
                      "job time with the fault s": faulty.wall_seconds,
                      "job time without s": clean.wall_seconds,
                      "steady-state steps/s": steady_rate(clean.steps, args.warmup_steps)}
            print(f"round {round_ + 1} {system:<8} " + "  ".join(f"{k} {v:.3f}" for k, v in values.items()),
                  flush=True)
            for name, value in values.items():
                figures[system].setdefault(name, []).append(value)
    redone_target = f"<= {args.save_steps} steps" if args.mode == "rollback" else "0 steps"
    targets = {"recovery s": "<= 0.3", "steps redone": redone_target, "job time with the fault s": "-",
               "job time without s": "-", "steady-state steps/s": ">= 0.98"}
    print(f"\nkill -9 of rank {args.kill_rank} of {args.workers} after step {args.kill_step}, "
          f"{args.max_steps} steps, checkpoint every {args.save_steps}, tftrun mode {args.mode}"
          f"{' ' + ' '.join(args.tftrun_arg) if args.tftrun_arg else ''}; median of {args.rounds} round(s)")
    for name, target in targets.items():
        print(ratio_line(name, median(figures["tftrun"][name]), median(figures["torchrun"][name]), target))


if __name__ == "__main__":
    main()
