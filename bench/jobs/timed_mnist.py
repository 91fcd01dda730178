"""Bench job: the main job (templates/mnist/train.py), timed step by step, with an optional self-kill.

    timed_mnist.py --timing_dir DIR [--kill_rank R --kill_step S] [TEMPLATE ARGS...]

The same script runs under torchrun and under tftrun, so that both launch the very same
training. It replaces the template's ``ElasticTrainer`` with a subclass that appends one
line to ``DIR/steps_<rank>.txt`` (format: step_log.py) every time a step
*completes* — when the trainer hands the step to its checkpoint saver (``step_end``),
which it does only for a step whose gradient all-reduce succeeded, never for one a fault
voided. (Not on ``report_step``: the trainer also reports a step when it merely reaches
the step's all-reduce, so that a hung rank stays behind.) Rank R, once step S is complete
and only the first time (a marker file ``DIR/killed`` holds the kill time), ``kill -9``s
itself. The product's code is untouched.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from step_log import KILL_FILE, StepRecord, steps_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "templates" / "mnist"))
import train  # noqa: E402 - the template, found through its folder

from recovery.elastic import ElasticTrainer  # noqa: E402


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This job's own options; the rest goes to the template."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--timing_dir", type=Path, required=True)
    parser.add_argument("--kill_rank", type=int, default=-1, help="the rank that kills itself (-1: none)")
    parser.add_argument("--kill_step", type=int, default=0, help="after completing this global step")
    return parser.parse_known_args(argv)


def kill_self_once(timing_dir: Path) -> None:
    """SIGKILL this process unless it was done before (by an earlier incarnation of the rank)."""
    try:
        fd = os.open(timing_dir / KILL_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, repr(time.time()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def timed_trainer(options: argparse.Namespace) -> type[ElasticTrainer]:
    """An ElasticTrainer that logs every completed step and kills itself where asked."""

    class TimedTrainer(ElasticTrainer):
        def __init__(self, ctx: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(ctx, *args, **kwargs)
            step_end = self.saver.step_end
            log = steps_file(options.timing_dir, ctx.rank).open("a", buffering=1)

            def log_and_step_end(epoch: int, step: int, global_step: int) -> Path | None:
                log.write(StepRecord(ctx.rank, global_step, time.time(), os.getpid()).line())
                if ctx.rank == options.kill_rank and global_step == options.kill_step:
                    kill_self_once(options.timing_dir)
                return step_end(epoch, step, global_step)

            self.saver.step_end = log_and_step_end  # type: ignore[method-assign]

    return TimedTrainer


def main() -> int:
    options, template_args = parse_args(sys.argv[1:])
    options.timing_dir.mkdir(parents=True, exist_ok=True)
    train.ElasticTrainer = timed_trainer(options)
    return train.main(template_args)


if __name__ == "__main__":
    sys.exit(main())
