"""Bench job: the main job (templates/mnist/train.py), timed step by step, with an optional fault.

    timed_mnist.py --timing_dir DIR [--fault kill|uce|slow --fault_rank R --fault_step S
        [--fault_factor F]] [--no_step_times] [TEMPLATE ARGS...]

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
* ``slow``: from step S on, the process's steps are ``--fault_factor`` times slower, as
  ``tftctl inject --fault slow --factor F --at_step S`` makes them (the same hand-over);
  its fault time is taken likewise. A relaunched rank is not slowed again.

``--no_step_times``: the ranks send the straggler detector no compute times (their step
clock still runs), to measure what the detector costs. Rank 0 writes its final model's
mean loss over the first 2 000 samples to ``DIR/final_loss`` (step_log.py), to compare
the final state of two runs.

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

import torch
import torch.nn.functional as F
from step_log import FAULT_FILE, FINAL_LOSS_FILE, StepRecord, steps_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "templates" / "mnist"))
import train  # noqa: E402 - the template, found through its folder

from recovery.control.inject import Injection, new_id  # noqa: E402
from recovery.env import DATA_PATH  # noqa: E402
from recovery.train.elastic import ElasticTrainer  # noqa: E402

FAULTS = ("kill", "uce", "slow")
LOSS_SAMPLES = 2000


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This job's own options; the rest goes to the template."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--timing_dir", type=Path, required=True)
    parser.add_argument("--fault", choices=FAULTS, default="kill")
    parser.add_argument("--fault_rank", type=int, default=-1, help="the rank that fails (-1: none)")
    parser.add_argument("--fault_step", type=int, default=0,
                        help="kill: after completing this global step; uce, slow: inside it")
    parser.add_argument("--fault_factor", type=float, default=3.0,
                        help="slow: how many times slower the rank's steps become")
    parser.add_argument("--no_step_times", action="store_true",
                        help="send the straggler detector no compute times")
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


def arm_injection(ctx: Any, options: argparse.Namespace) -> None:
    """Hand the trainer an injected ``uce`` or ``slow`` for step S once, and time it at the
    step's all-reduce."""
    pending_injection, report_step = ctx.pending_injection, ctx.report_step
    factor = options.fault_factor if options.fault == "slow" else None
    armed = False

    def inject(global_step: int) -> Injection | None:
        nonlocal armed
        if global_step == options.fault_step and not (options.timing_dir / FAULT_FILE).exists():
            armed = True
            return Injection(new_id(), ctx.rank, options.fault, global_step, factor)
        return pending_injection(global_step)

    def report_and_time(step: int) -> None:
        nonlocal armed
        if armed:  # a uce is raised right after this report; a slow step sleeps next
            armed = False
            record_fault_once(options.timing_dir)
        report_step(step)

    ctx.pending_injection, ctx.report_step = inject, report_and_time


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
            if faulty and options.fault in ("uce", "slow"):
                arm_injection(ctx, options)
            if options.no_step_times:
                ctx.report_step_time = lambda seconds: None
            if ctx.rank == 0:
                trained.append(self.model)

    trained: list[torch.nn.Module] = []
    TimedTrainer.trained = trained  # type: ignore[attr-defined]
    return TimedTrainer


def final_loss(model: torch.nn.Module, template_args: list[str]) -> float:
    """``model``'s mean loss over the first :data:`LOSS_SAMPLES` samples of the job's data."""
    args = train.parse_args(template_args)
    images, labels = train.load_dataset(os.environ.get(DATA_PATH), args.synthetic_size)
    first = torch.arange(LOSS_SAMPLES)
    with torch.no_grad():
        inputs = (images[first].float() / 255 - train.MEAN) / train.STD
        return float(F.cross_entropy(model(inputs), labels[first]))


def main() -> int:
    options, template_args = parse_args(sys.argv[1:])
    options.timing_dir.mkdir(parents=True, exist_ok=True)
    train.ElasticTrainer = trainer = timed_trainer(options)
    status = train.main(template_args)
    if status == 0 and trainer.trained:  # type: ignore[attr-defined]
        loss = final_loss(trainer.trained[-1], template_args)  # type: ignore[attr-defined]
        (options.timing_dir / FINAL_LOSS_FILE).write_text(repr(loss))
    return status


if __name__ == "__main__":
    sys.exit(main())
