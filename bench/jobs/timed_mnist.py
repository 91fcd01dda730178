"""Bench job: the main job (templates/mnist/train.py), timed step by step, with an optional fault.

    timed_mnist.py --timing_dir DIR [--fault kill|uce --fault_rank R --fault_step S] [TEMPLATE ARGS...]

The same script runs under torchrun and under tftrun, so that both launch the very same
training. It replaces the template's ``ElasticTrainer`` with a subclass that appends one
line to ``DIR/steps_<rank>.txt`` (format: step_log.py) every time a step
*completes* — when the trainer hands the step to its checkpoint saver (``step_end``),
which it does only for a step whose gradient all-reduce succeeded, never for one a fault
voided. (Not on ``report_step``: the trainer also reports a step when it merely reaches
the step's all-reduce, so that a hung rank stays behind.)

Rank R suffers the fault once, the first time it gets there (a marker file ``DIR/fault``
holds the fault time, so a restarted rank does not do it again):

* ``kill``: once step S is complete, it ``kill -9``s itself;
* ``uce``: step S raises a :class:`recovery.faults.DeviceError` at its gradient
  all-reduce — what ``tftctl inject --fault uce --at_step S`` does: the job hands the
  trainer the same injection the scheduler would (``ctx.pending_injection``), without the
  scheduler's round trip, so it works under torchrun too. The fault time is taken when
  the trainer reports that step S reached its all-reduce, just before it raises.

The product's code is untouched.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from step_log import FAULT_FILE, StepRecord, steps_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "templates" / "mnist"))
import train  # noqa: E402 - the template, found through its folder

from recovery.control.inject import Injection, new_id  # noqa: E402
from recovery.train.elastic import ElasticTrainer  # noqa: E402

FAULTS = ("kill", "uce")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This job's own options; the rest goes to the template."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--timing_dir", type=Path, required=True)
    parser.add_argument("--fault", choices=FAULTS, default="kill")
    parser.add_argument("--fault_rank", type=int, default=-1, help="the rank that fails (-1: none)")
    parser.add_argument("--fault_step", type=int, default=0,
                        help="kill: after completing this global step; uce: inside it")
    return parser.parse_known_args(argv)


def record_fault_once(timing_dir: Path) -> bool:
    """Write the fault time to the marker file; False (and nothing written) if an earlier
    incarnation of the rank did."""
    try:
        fd = os.open(timing_dir / FAULT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, repr(time.time()).encode())
    os.close(fd)
    return True


def arm_uce(ctx: Any, options: argparse.Namespace) -> None:
    """Hand the trainer an injected ``uce`` for step S once, and time it at the all-reduce."""
    pending_injection, report_step = ctx.pending_injection, ctx.report_step
    armed = False

    def inject_uce(global_step: int) -> Injection | None:
        nonlocal armed
        if global_step == options.fault_step and not (options.timing_dir / FAULT_FILE).exists():
            armed = True
            return Injection(new_id(), ctx.rank, "uce", global_step)
        return pending_injection(global_step)

    def report_and_time(step: int) -> None:
        nonlocal armed
        if armed:  # the trainer raises the injected error right after this report
            armed = False
            record_fault_once(options.timing_dir)
        report_step(step)

    ctx.pending_injection, ctx.report_step = inject_uce, report_and_time


def timed_trainer(options: argparse.Namespace) -> type[ElasticTrainer]:
    """An ElasticTrainer that logs every completed step and fails where asked."""

    class TimedTrainer(ElasticTrainer):
        def __init__(self, ctx: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(ctx, *args, **kwargs)
            step_end = self.saver.step_end
            log = steps_file(options.timing_dir, ctx.rank).open("a", buffering=1)
            faulty = ctx.rank == options.fault_rank

            def log_and_step_end(epoch: int, step_in_epoch: int, global_step: int) -> Path | None:
                log.write(StepRecord(ctx.rank, global_step, time.time(), os.getpid()).line())
                if (faulty and options.fault == "kill" and global_step == options.fault_step
                        and record_fault_once(options.timing_dir)):
                    os.kill(os.getpid(), signal.SIGKILL)
                return step_end(epoch, step_in_epoch, global_step)

            self.saver.step_end = log_and_step_end  # type: ignore[method-assign]
            if faulty and options.fault == "uce":
                arm_uce(ctx, options)

    return TimedTrainer


def main() -> int:
    options, template_args = parse_args(sys.argv[1:])
    options.timing_dir.mkdir(parents=True, exist_ok=True)
    train.ElasticTrainer = timed_trainer(options)
    return train.main(template_args)


if __name__ == "__main__":
    sys.exit(main())
