"""The CUDA path on one GPU, checked in one command that prints one table.

    PYTHONPATH=. python3 bench/gpu_check.py [--device cuda|cpu] [--budget 320] [--keep DIR] [--json]

Run from the repository's root on a machine with a GPU (docs/gpu.md). Each row is one
check: its result (``ok``, ``FAIL``, or ``skipped`` with why) and its figure. The jobs:

* ``probe``: bench/scripts/cuda_first_step.py, 2 ranks under tftrun, once with the fork
  server (tftrun's default) and once spawned (``--fork_server=false``): every rank's first
  CUDA calls (``set_device``, an allocation, a gloo all-reduce of CUDA tensors), a
  ``kill -9`` of rank 1 and the group's restart. The fork server's log says whether its
  warm-up left CUDA uninitialised (it refuses to serve otherwise).
* ``template``: the main job (templates/mnist/train.py ``--device cuda``, timed step by
  step by bench/jobs/timed_mnist.py, held 0.2 s a step while degraded by
  tests/bin/paced.py), 4 ranks sharing the GPU over gloo, ``--rejoin_cooldown=1`` (a
  relaunched rank is back within a degraded step with none):
  ``tftctl inject --fault uce`` into rank 1 (repaired in place), then rank 2 ``kill -9``s
  itself; the survivors train degraded and the relaunched rank heals from a replica.
  Run with the fork server and spawned (``--fork_server=false``: a cold start). A third run,
  with only last words on (``--enable_tft={TTP:1,UCE:0,ARF:0}``, ``--min_worker_num=4``),
  rolls every rank back to the last-words checkpoint of the kill.
* ``nccl``: bench/scripts/nccl_reform.py, an NCCL group of one rank formed, aborted and
  formed again in one process.

Without CUDA only the fork server's check runs (on the CPU) and the rest is skipped, with
status 0; ``--device cpu`` runs every check but the NCCL one on the CPU instead, which
tests this script, not CUDA. Status 1 when a check failed. ``--budget`` bounds the whole
run: a check that would start past it is skipped. ``--keep DIR`` keeps every job's
folder (``logs/`` with ``events.jsonl`` and the workers' logs, ``tftrun.out``) to read
after a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import add_json_flag, emit, tftrun_cmd

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PROBE = BENCH / "scripts" / "cuda_first_step.py"
NCCL = BENCH / "scripts" / "nccl_reform.py"
TIMED = BENCH / "jobs" / "timed_mnist.py"
GATED = REPO / "tests" / "bin" / "gated.py"
PACED = REPO / "tests" / "bin" / "paced.py"
NEEDED = ("torch", "numpy", "psutil", "typer", "rich", "filelock", "xxhash")
"""What tftrun imports (pyproject.toml's dependencies)."""
PROBE_RANKS, TEMPLATE_RANKS = 2, 4
UCE_RANK, UCE_STEP, KILL_RANK, KILL_STEP, MAX_STEPS = 1, 30, 2, 90, 250
"""The kill comes between two checkpoints (every 20 steps), so that the last words are newest."""
TEMPLATE_ARGS = ("--epochs", "3", "--max_steps", str(MAX_STEPS), "--save_steps", "20",
                 "--synthetic_size", "12000", "--log_every", "50")
LAST_WORDS_ONLY = "{TTP:1,UCE:0,ARF:0}"
JOB_TIMEOUT = 150.0
"""Seconds one job may take (a template run took 60-80 s on 2 busy cores)."""
RUN_DIR = "gpu_check"


class CheckFailed(Exception):
    """A check found the CUDA path broken (the message says how)."""


@dataclass
class Row:
    check: str
    result: str
    figure: str


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
    return value


def events_of(log_dir: Path, name: str, **match: Any) -> list[dict[str, Any]]:
    from recovery.events import read_events

    return [e for e in read_events(log_dir)
            if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


@dataclass
class Job:
    """One tftrun job of the check, its files under ``root``."""

    root: Path
    name: str
    started: float = 0.0

    @property
    def log_dir(self) -> Path:
        return self.root / self.name / "logs"

    @property
    def out(self) -> Path:
        return self.root / self.name / "out"

    def start(self, workers: int, script: Sequence[str], options: Sequence[str]) -> subprocess.Popen[bytes]:
        self.out.mkdir(parents=True)
        cmd = tftrun_cmd(workers, self.log_dir, *script, extra=(
            f"--recovery_path={self.root / self.name / 'recovery'}", "--rejoin_cooldown=1",
            *options))
        self.started = time.time()
        with (self.root / self.name / "tftrun.out").open("wb") as output:
            return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=output,
                                    stderr=subprocess.STDOUT)

    def finish(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Wait for the job; it must end with status 0."""
        try:
            status = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise CheckFailed(f"{self.name}: the job did not end within {timeout:.0f}s "
                              f"({self.tail()})") from None
        if status != 0:
            raise CheckFailed(f"{self.name}: tftrun exited {status} ({self.tail()})")

    def tail(self) -> str:
        text = (self.root / self.name / "tftrun.out").read_text(errors="replace").strip()
        return " | ".join(text.splitlines()[-3:]) or "no output"


def child_env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH`` (absolute: the jobs
    run in other folders too)."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


# ---------------------------------------------------------------------------- the probe
@dataclass
class Probe:
    """What one probe job saw: each rank's record per restart, the kill's time."""

    job: Job
    records: dict[tuple[int, int], dict[str, Any]]
    killed_at: float

    def launch_to_first_step(self) -> float:
        return max(self.records[(rank, 0)]["first_step"] for rank in range(PROBE_RANKS)) - self.job.started

    def restart_to_first_step(self) -> float:
        return max(self.records[(rank, 1)]["first_step"] for rank in range(PROBE_RANKS)) - self.killed_at


def run_probe(root: Path, name: str, device: str, forked: bool, timeout: float) -> Probe:
    job = Job(root, name)
    options = ("--max_restarts=1", *(() if forked else ("--fork_server=false",)))
    proc = job.start(PROBE_RANKS, (str(PROBE), str(job.out), device), options)
    try:
        def read(rank: int, restart: int) -> dict[str, Any] | None:
            path = job.out / f"{rank}.{restart}.json"
            return json.loads(path.read_text()) if path.exists() else None

        def first_launch() -> list[dict[str, Any]] | None:
            if proc.poll() is not None:
                raise CheckFailed(f"{name}: tftrun exited {proc.returncode} before the kill ({job.tail()})")
            seen = [read(rank, 0) for rank in range(PROBE_RANKS)]
            return None if None in seen else seen

        first = wait_until(first_launch, timeout, f"{name}: every rank's first step")
        check_records(name, first)
        os.kill(first[1]["pid"], signal.SIGKILL)
        killed_at = time.time()
        job.finish(proc, max(timeout - (time.time() - job.started), 1.0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    records = {(rank, restart): record for restart in (0, 1) for rank in range(PROBE_RANKS)
               if (record := read(rank, restart)) is not None}
    check_records(name, [records.get((rank, 1)) for rank in range(PROBE_RANKS)])
    spawns = [e for e in events_of(job.log_dir, "spawn", role="worker")]
    if any(bool(e.get("forked")) != forked for e in spawns):
        raise CheckFailed(f"{name}: a worker was {'not ' if forked else ''}forked: {spawns}")
    return Probe(job, records, killed_at)


def check_records(name: str, records: Sequence[dict[str, Any] | None]) -> None:
    expected = sum(range(1, PROBE_RANKS + 1))
    for rank, record in enumerate(records):
        if record is None:
            raise CheckFailed(f"{name}: rank {rank} wrote no record")
        if "error" in record:
            raise CheckFailed(f"{name}: rank {rank}: {record['error']}")
        if record["bad_fork"] or record["sum"] != expected:
            raise CheckFailed(f"{name}: rank {rank}: bad_fork={record['bad_fork']} "
                              f"sum={record['sum']} (expected {expected})")


def fork_server_line(job: Job) -> str:
    """The fork server's ready line, which says it left CUDA uninitialised."""
    from launcher.procs.fork_server_main import CUDA_UNTOUCHED

    log = job.log_dir / "fork_server.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if CUDA_UNTOUCHED in line]
    if not lines:
        raise CheckFailed(f"no '{CUDA_UNTOUCHED}' line in {log}: {text.strip()[-300:] or 'empty'}")
    return lines[0]


# ---------------------------------------------------------------------------- the template
@dataclass
class TemplateRun:
    """What a run of the main job saw: its events, its ranks' completed steps, the kill."""

    job: Job
    steps: dict[int, list[Any]]
    fault_at: float

    def relaunched_first_step(self) -> Any:
        """The first step the relaunched rank completed (its record)."""
        killed = self.steps[KILL_RANK][0].pid
        return next(r for r in self.steps[KILL_RANK] if r.pid != killed)

    def first_step_after_kill(self) -> float:
        """Seconds from the kill until the relaunched rank completed a step."""
        return self.relaunched_first_step().time - self.fault_at

    def degraded_steps(self) -> int:
        """Steps the survivors trained without the killed rank: after the kill's, before
        the one its relaunch took up training with."""
        return self.relaunched_first_step().step - 1 - KILL_STEP

    def same_hash(self) -> str:
        digests = {e["rank"]: e["params_sha256"] for e in events_of(self.job.log_dir, "train_end")}
        if sorted(digests) != list(range(TEMPLATE_RANKS)) or len(set(digests.values())) != 1:
            raise CheckFailed(f"{self.job.name}: the ranks end with different parameters: {digests}")
        return next(iter(digests.values()))

    def rollback(self, source: str) -> dict[str, Any]:
        """The last rollback from ``source`` (after the kill, but for ``in_place``)."""
        found = [e for e in events_of(self.job.log_dir, "rollback", source=source)
                 if e["ts"] >= self.fault_at or source == "in_place"]
        if not found:
            sources = [e["source"] for e in events_of(self.job.log_dir, "rollback")]
            raise CheckFailed(f"{self.job.name}: no rollback from {source} (rollbacks: {sources})")
        return found[-1]


def run_template(root: Path, name: str, device: str, options: Sequence[str], uce: bool,
                 timeout: float) -> TemplateRun:
    sys.path.insert(0, str(BENCH / "jobs"))
    from step_log import read_fault_time, read_steps

    job = Job(root, name)
    gate = root / name / "gate"
    script = (str(GATED), str(gate), str(PACED), "--while_degraded", str(TIMED),
              "--timing_dir", str(root / name / "out"), "--fault", "kill",
              "--fault_rank", str(KILL_RANK), "--fault_step", str(KILL_STEP),
              "--device", device, *TEMPLATE_ARGS)
    proc = job.start(TEMPLATE_RANKS, script, options)
    try:
        wait_until(lambda: events_of(job.log_dir, "scheduler_start"), timeout, f"{name}: the scheduler")
        if uce:
            inject = subprocess.run(
                [sys.executable, "-m", "launcher.cli.tftctl", "inject", f"--log_dir={job.log_dir}",
                 f"--rank={UCE_RANK}", "--fault=uce", f"--at_step={UCE_STEP}"],
                cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60)
            if inject.returncode != 0:
                raise CheckFailed(f"{name}: tftctl inject: {(inject.stdout + inject.stderr).strip()}")
        gate.touch()
        job.finish(proc, timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = TemplateRun(job, read_steps(job.out), read_fault_time(job.out))
    if not events_of(job.log_dir, "fault", rank=KILL_RANK, cause="SIGKILL"):
        raise CheckFailed(f"{name}: no kill -9 of rank {KILL_RANK} in events.jsonl")
    return run


def template_figure(run: TemplateRun, source: str) -> str:
    rollback = run.rollback(source)
    origin = f" from rank {rollback['from_rank']}" if "from_rank" in rollback else ""
    return (f"{source}{origin} at step {rollback['step']}, relaunched rank's first step "
            f"{run.first_step_after_kill():.2f} s after the kill, {run.degraded_steps()} degraded "
            f"steps, hash {run.same_hash()[:12]} on all {TEMPLATE_RANKS}")


# ---------------------------------------------------------------------------- the checks
class Checker:
    """Runs the checks in order within the budget, and collects the table."""

    def __init__(self, device: str, deadline: float, root: Path) -> None:
        self.device = device
        self.deadline = deadline
        self.root = root
        self.rows: list[Row] = []
        self.results: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def row(self, check: str, run: Callable[[], str], needs: str | None = None) -> None:
        """Add ``check``'s row: ``run()``'s figure, or why it failed or was skipped."""
        if needs is not None:
            self.rows.append(Row(check, f"skipped: {needs}", ""))
            return
        if self.left() < 20:
            self.rows.append(Row(check, "skipped: out of time (--budget)", ""))
            return
        try:
            self.rows.append(Row(check, "ok", run()))
        except CheckFailed as failed:
            self.rows.append(Row(check, "FAIL", str(failed)))
        except Exception as err:  # noqa: BLE001 - one broken check does not hide the others
            self.rows.append(Row(check, "FAIL", f"{type(err).__name__}: {err}"))
        print(f"{check}: {self.rows[-1].result} {self.rows[-1].figure}", file=sys.stderr, flush=True)

    def timeout(self) -> float:
        return min(JOB_TIMEOUT, max(self.left(), 1.0))

    def probes(self, with_cuda: bool) -> None:
        """The fork server's check (on any machine), the first CUDA calls and their times."""
        probes: dict[str, Probe] = {}

        def probe(label: str, forked: bool) -> Probe:
            probes[label] = run_probe(self.root, f"probe_{label}", self.device, forked, self.timeout())
            return probes[label]

        def fork_server() -> str:
            line = fork_server_line(probe("fork", True).job)
            return line.split(": ", 1)[1]

        self.row("fork server leaves CUDA uninitialised", fork_server)
        no_cuda = None if with_cuda else "no CUDA"
        for label in ("fork", "spawn"):
            def first_calls(label: str = label) -> str:
                found = probes.get(label) or probe(label, label == "fork")
                record = found.records[(0, 0)]
                return (f"{PROBE_RANKS} ranks on {record['device']}: set_device, allocation, gloo "
                        f"group and all_reduce done {record['first_step'] - record['imported']:.2f} s "
                        "after import")

            name = "forked worker" if label == "fork" else "spawned worker (--fork_server=false)"
            self.row(f"{name}: first CUDA calls", first_calls, no_cuda)
        if "fork" in probes and "spawn" in probes:
            fork, spawn = probes["fork"], probes["spawn"]
            self.results["launch_to_first_step"] = {
                "fork": fork.launch_to_first_step(), "spawn": spawn.launch_to_first_step()}
            self.results["restart_to_first_step"] = {
                "fork": fork.restart_to_first_step(), "spawn": spawn.restart_to_first_step()}
            self.row("launch to first CUDA step (2 ranks)", lambda: (
                f"fork server {fork.launch_to_first_step():.2f} s, "
                f"spawn {spawn.launch_to_first_step():.2f} s"))
            self.row("kill -9, group restart to first CUDA step", lambda: (
                f"fork server {fork.restart_to_first_step():.2f} s, "
                f"spawn {spawn.restart_to_first_step():.2f} s"))
        else:
            why = "a probe failed" if with_cuda else "no CUDA"
            self.row("launch to first CUDA step (2 ranks)", str, why)
            self.row("kill -9, group restart to first CUDA step", str, why)

    def templates(self, with_cuda: bool) -> None:
        no_cuda = None if with_cuda else "no CUDA"
        runs: dict[str, TemplateRun] = {}

        def template(label: str, options: Sequence[str]) -> str:
            runs[label] = run_template(self.root, f"template_{label}", self.device, options,
                                       uce=True, timeout=self.timeout())
            run = runs[label]
            in_place = run.rollback("in_place")
            if not events_of(run.job.log_dir, "fault", rank=UCE_RANK, cause="uce"):
                raise CheckFailed(f"{run.job.name}: rank {UCE_RANK} saw no injected uce")
            if run.degraded_steps() < 1:
                raise CheckFailed(f"{run.job.name}: no step trained degraded")
            return f"uce in place at step {in_place['step']}; " + template_figure(run, "replica")

        self.row("template on CUDA, fork server: uce, kill -9, replica",
                 lambda: template("fork", ()), no_cuda)
        self.row("template on CUDA, spawned: uce, kill -9, replica",
                 lambda: template("spawn", ("--fork_server=false",)), no_cuda)
        if "fork" in runs and "spawn" in runs:
            fork, spawn = runs["fork"], runs["spawn"]
            self.results["relaunched_rank_to_first_step"] = {
                "fork": fork.first_step_after_kill(), "spawn": spawn.first_step_after_kill()}
            self.row("kill -9, relaunched rank to its first CUDA step", lambda: (
                f"fork server {fork.first_step_after_kill():.2f} s, "
                f"spawn {spawn.first_step_after_kill():.2f} s"))
        else:
            self.row("kill -9, relaunched rank to its first CUDA step", str,
                     "a template run failed" if with_cuda else "no CUDA")

        def last_words() -> str:
            run = run_template(self.root, "template_last_words", self.device,
                               (f"--min_worker_num={TEMPLATE_RANKS}", f"--enable_tft={LAST_WORDS_ONLY}"),
                               uce=False, timeout=self.timeout())
            saved = events_of(run.job.log_dir, "last_words_saved")
            if not saved:
                raise CheckFailed("no last_words_saved event")
            return f"last words of step {saved[0]['step']} saved; " + template_figure(run, "last_words")

        self.row("template on CUDA: last words, rollback of every rank", last_words, no_cuda)

    def nccl(self, with_cuda: bool) -> None:
        def reform() -> str:
            done = subprocess.run([sys.executable, str(NCCL)], cwd=REPO, env=child_env(),
                                  capture_output=True, text=True, timeout=self.timeout())
            if done.returncode != 0:
                raise CheckFailed(f"status {done.returncode}: {done.stderr.strip()[-300:]}")
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            self.results["nccl"] = seen
            groups = [seen["group 1"], seen["group 2"]]
            if not all(g["formed"] and g["sum"] == 1.0 for g in groups) or not seen["abort 1"]["left"]:
                raise CheckFailed(json.dumps(seen))
            return (f"TORCH_NCCL_ASYNC_ERROR_HANDLING {seen['before']} -> {groups[0]['error_handling']}; "
                    f"formed {groups[0]['seconds']:.2f} s, aborted {seen['abort 1']['seconds']:.2f} s, "
                    f"formed again {groups[1]['seconds']:.2f} s")

        needs = None if with_cuda and self.device == "cuda" else "no CUDA"
        self.row("NCCL group of one: form, abort, form again", reform, needs)


def missing_packages() -> list[str]:
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def environment() -> tuple[Row, bool]:
    """The first row (torch, its CUDA, the GPU), and whether CUDA is usable."""
    import torch

    from recovery.runtime.torch_compat import TorchVersionError, check_version

    try:
        check_version(torch.__version__)
    except TorchVersionError as err:
        return Row("environment", "FAIL", str(err)), False
    if not torch.cuda.is_available():
        return Row("environment", "ok", f"torch {torch.__version__}, no CUDA"), False
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return Row("environment", "ok", f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
                                   f"{torch.cuda.device_count()} x {', '.join(names)}"), True


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| check | result | figure |", "|---|---|---|"]
    return lines + [f"| {r.check} | {r.result} | {r.figure} |" for r in rows]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: run the CUDA checks on the CPU instead (tests this script)")
    parser.add_argument("--budget", type=float, default=320.0,
                        help="seconds the whole run may take (default 320)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a new folder to keep the jobs' logs and events in (default: a "
                             "temporary one, removed at the end)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep: {args.keep} is not empty")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget
    missing = missing_packages()
    if missing:
        print(f"gpu_check: missing Python packages: {' '.join(missing)}; install them "
              f"(pip install {' '.join(missing)}) and run again", file=sys.stderr)
        return 1
    first, has_cuda = environment()
    if first.result == "FAIL":
        emit({"rows": [vars(first)]}, args.json, table([first]))
        return 1
    with_cuda = has_cuda or args.device == "cpu"
    device = args.device if has_cuda else "cpu"
    with (contextlib.nullcontext(str(args.keep)) if args.keep is not None
          else tempfile.TemporaryDirectory(prefix=RUN_DIR)) as tmp:
        checker = Checker(device, deadline, Path(tmp))
        checker.rows.append(first)
        checker.probes(with_cuda)
        checker.templates(with_cuda)
        checker.nccl(with_cuda)
    skipped = [r for r in checker.rows if r.result.startswith("skipped")]
    failed = [r for r in checker.rows if r.result == "FAIL"]
    text = table(checker.rows)
    if args.device == "cpu":
        text.append("--device cpu: the CUDA checks ran on the CPU (a test of this script, not of CUDA)")
    if skipped:
        reasons = sorted({r.result.removeprefix("skipped: ") for r in skipped})
        text.append(f"skipped: {'; '.join(reasons)}: {', '.join(r.check for r in skipped)}")
    emit({"device": device, "rows": [vars(r) for r in checker.rows], "figures": checker.results},
         args.json, text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
