"""Recovery of scripts that keep their own loop: tftrun against torchrun, in one invocation.

For each client, three runs: a fault-free one under tftrun; one under tftrun with tftrun's
recovery; one under torchrun (``--standalone --max_restarts=1``, the script as it is:
torchrun's behaviour). The clients:

* ``ddp``: pytorch/examples' DDP tutorial ported to CPU (tests/bin/ddp_tutorial.py, its
  snapshot every epoch of 32 steps; ``--ddp_epochs`` epochs), under tftrun with
  ``recovery.attach`` (tests/bin/ddp_tutorial_attached.py) and ``--rejoin_cooldown=0``
  (torchrun restarts at once too), its updates clocked by bench/ddp_clock.py, rank 1
  killed after ``--ddp_kill_after`` updates (mid-epoch);
* ``lightning`` and ``hf``: the 2-rank jobs of tests/integration/test_frameworks.py (a
  checkpoint of their own every 10 steps), rank 1 killed once it reported step
  ``--kill_after`` (between two checkpoints); under tftrun (its defaults), Lightning with
  ``recovery.lightning.RestartableDDP``, Hugging Face with the last-words callback and its
  entry point ``@recovery.restartable``.

Each step takes about 50 ms (``STEP_SECONDS`` for the DDP tutorial). Per client it reports:

* ``steps_redone`` / ``torchrun_steps_redone``: the last step completed before the kill
  minus the step the restart resumed at (target 0; torchrun redoes up to the interval);
* ``recovery_ratio``: the time from the kill until every rank completed a step again,
  tftrun's over torchrun's (target ≤ 0.3);
* ``survivors_kept_pids``: whether rank 0's process after the kill is the one before;
* ``final_loss_rel_diff``: tftrun's final loss against the fault-free run's, relative
  (target ≤ 1e-4).

and ``ddp_steady_ratio``: the DDP tutorial's updates per second in its fault-free run
under tftrun with ``recovery.attach``, over the unchanged script's under torchrun (target
≥ 0.98). ``--json`` prints, as its last line, ``{"clients": {"ddp": C, "lightning": C,
"hf": C}, "ddp_steady_ratio": float}``.

Run: ``PYTHONPATH=. python3 bench/frameworks_recovery.py [--json]`` (needs
``pip install -e '.[frameworks]'``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import add_json_flag, emit, median, ratio, tftrun_cmd, torchrun_cmd

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "bin"
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""A fresh store for each torchrun attempt: a restarted group otherwise meets the previous
attempt's keys (pytorch#135712; bench/fault_recovery.py does the same)."""
WORKERS = 2
KILLED_RANK = 1


DDP_STEPS_PER_EPOCH = 2048 // WORKERS // 32
"""The DDP tutorial's steps per epoch: 2048 samples, 32 a rank and step."""
STEP_SECONDS = "0.05"


@dataclass(frozen=True)
class Client:
    """A framework job: its script, the file its own checkpoint of step 10 leaves, the
    script's flag for tftrun's way, and tftrun's options."""

    script: str
    first_checkpoint: str
    way: str = "--last-words"
    options: tuple[str, ...] = ()

    def command(self, system: str, out: Path, timing: Path, args: argparse.Namespace) -> list[str]:
        job = [str(JOBS / self.script), str(out), str(args.steps), f"--timing={timing}"]
        return [*job, self.way] if system == "tftrun" else job

    def kill_after(self, args: argparse.Namespace) -> int:
        return args.kill_after

    def steps_redone(self, faulty: Run, figures: dict[str, Any], args: argparse.Namespace) -> int:
        return figures["steps_redone"]


@dataclass(frozen=True)
class DdpClient(Client):
    """The DDP tutorial, clocked per update (bench/ddp_clock.py): under tftrun the script
    with ``recovery.attach``, under torchrun the unchanged one. It runs in ``out``, where it
    writes its snapshot."""

    attached: str = ""

    def command(self, system: str, out: Path, timing: Path, args: argparse.Namespace) -> list[str]:
        script = self.attached if system == "tftrun" else self.script
        return [str(Path(__file__).resolve().parent / "ddp_clock.py"), str(timing),
                str(JOBS / script), str(args.ddp_epochs), "1"]

    def kill_after(self, args: argparse.Namespace) -> int:
        return args.ddp_kill_after

    def steps_redone(self, faulty: Run, figures: dict[str, Any], args: argparse.Namespace) -> int:
        """The updates rank 0 applied, in all its processes, beyond the job's steps."""
        return len(faulty.steps[0]) - args.ddp_epochs * DDP_STEPS_PER_EPOCH


CLIENTS: dict[str, Client] = {
    # tftrun relaunches the dead rank at once, as torchrun restarts the group: with the 30 s
    # default cooldown the DDP survivor trains the job to its end alone.
    "ddp": DdpClient("ddp_tutorial.py", "snapshot.pt", options=("--rejoin_cooldown=0",),
                     attached="ddp_tutorial_attached.py"),
    "lightning": Client("lightning_tiny.py", "last.ckpt", "--restartable"),
    "hf": Client("hf_tiny.py", "checkpoint-10", "--restartable"),
}


@dataclass
class Run:
    """One run: each rank's step records (step, time, pid), the kill's time, the final loss."""

    steps: dict[int, list[tuple[int, float, int]]]
    killed_at: float | None
    loss: float


def run(client: Client, system: str, args: argparse.Namespace, kill: bool) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"bench-frameworks-{system}-") as tmp:
        out, timing, logs = Path(tmp) / "out", Path(tmp) / "timing", Path(tmp) / "logs"
        out.mkdir()
        job = client.command(system, out, timing, args)
        # The jobs run in ``out``: a relative PYTHONPATH (``PYTHONPATH=.``) would not reach here.
        env = {**os.environ, "STEP_SECONDS": STEP_SECONDS,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        if system == "tftrun":
            cmd = tftrun_cmd(WORKERS, logs, *job, extra=(f"--recovery_path={Path(tmp) / 'recovery'}",
                                                         *client.options))
        else:
            cmd = torchrun_cmd(WORKERS, logs, *job, extra=("--standalone", "--max_restarts=1"))
            env.update(TORCHRUN_ENV)
        proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        killed_at = None
        try:
            if kill:
                killed_at = _kill_when_due(proc, out / client.first_checkpoint, timing,
                                           client.kill_after(args), args.timeout)
            output, _ = proc.communicate(timeout=args.timeout)
        finally:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{client.script} under {system} exited {proc.returncode}:\n{output[-3000:]}")
        return Run(_steps(timing), killed_at, _final_loss(timing))


def _final_loss(timing: Path) -> float:
    """Rank 0's final loss: the framework jobs' ``loss_0.txt``, or the DDP tutorial's
    ``final loss=L ...`` line."""
    path = timing / "loss_0.txt"
    if path.exists():
        return float(path.read_text().split()[-1])
    final = re.findall(r"^final loss=(\S+)", (timing / "out_0.txt").read_text(), re.MULTILINE)
    return float(final[-1])


def _kill_when_due(proc: subprocess.Popen[str], checkpoint: Path, timing: Path, kill_after: int,
                   timeout: float) -> float:
    """``kill -9`` rank 1 once the job's first checkpoint exists and rank 1 reported step
    ``kill_after``; returns when."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        records = _steps(timing).get(KILLED_RANK, [])
        if checkpoint.exists() and records and records[-1][0] >= kill_after:
            os.kill(records[-1][2], signal.SIGKILL)
            return time.time()
        time.sleep(0.01)
    raise RuntimeError(f"rank {KILLED_RANK} never reached step {kill_after}")


def _steps(timing: Path) -> dict[int, list[tuple[int, float, int]]]:
    found: dict[int, list[tuple[int, float, int]]] = {}
    for rank in range(WORKERS):
        path = timing / f"steps_{rank}.txt"
        if path.exists():
            lines = [line.split() for line in path.read_text().splitlines()]
            found[rank] = [(int(s), float(t), int(p)) for s, t, p in (line for line in lines if len(line) == 3)]
    return found


def after_the_kill(faulty: Run) -> dict[str, Any]:
    """Steps redone, the time until every rank stepped again, and whether rank 0 kept its pid."""
    assert faulty.killed_at is not None
    first_pid = {rank: records[0][2] for rank, records in faulty.steps.items()}
    split = {rank: _split(records, first_pid[rank], faulty.killed_at) for rank, records in faulty.steps.items()}
    before = [s for done, _ in split.values() for s in done]
    again = {rank: records for rank, (_, records) in split.items()}
    if not all(again.values()):
        raise RuntimeError(f"ranks {[r for r, records in again.items() if not records]} never "
                           "stepped again after the kill")
    resumed_at = min(records[0][0] for records in again.values()) - 1
    back = max(records[0][1] for records in again.values())
    survivor = faulty.steps[0]
    return {"steps_redone": max(before) - resumed_at, "recovery_s": back - faulty.killed_at,
            "survivors_kept_pids": survivor[-1][2] == first_pid[0]}


def _split(records: list[tuple[int, float, int]], first_pid: int,
           killed_at: float) -> tuple[list[int], list[tuple[int, float]]]:
    """A rank's steps before the kill, and (step, time) after it: split at its relaunch if
    it was relaunched, else at the kill."""
    relaunched = [(s, t) for s, t, pid in records if pid != first_pid]
    if relaunched:
        return [s for s, _, pid in records if pid == first_pid], relaunched
    return [s for s, t, _ in records if t <= killed_at], [(s, t) for s, t, _ in records if t > killed_at]


def measure(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    clean = run(client, "tftrun", args, kill=False)
    tft = after_the_kill(faulty := run(client, "tftrun", args, kill=True))
    torch_run = after_the_kill(torch_faulty := run(client, "torchrun", args, kill=True))
    return {"steps_redone": client.steps_redone(faulty, tft, args),
            "torchrun_steps_redone": client.steps_redone(torch_faulty, torch_run, args),
            "recovery_ratio": ratio(tft["recovery_s"], torch_run["recovery_s"]),
            "survivors_kept_pids": tft["survivors_kept_pids"],
            "final_loss_rel_diff": abs(faulty.loss - clean.loss) / abs(clean.loss),
            "recovery_s": tft["recovery_s"], "torchrun_recovery_s": torch_run["recovery_s"]}


def steady_ratio(args: argparse.Namespace) -> float:
    """The DDP tutorial's updates per second without a fault: tftrun with
    ``recovery.attach`` over torchrun with the unchanged script (rank 0's median interval
    between two updates, the first epoch left out as warm-up)."""
    client = CLIENTS["ddp"]

    def interval(system: str) -> float:
        times = [t for _s, t, _p in run(client, system, args, kill=False).steps[0]]
        steady = times[DDP_STEPS_PER_EPOCH:]
        return median([later - earlier for earlier, later in zip(steady, steady[1:])])

    return ratio(interval("torchrun"), interval("tftrun"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="steps of each job (default 30)")
    parser.add_argument("--kill_after", type=int, default=15,
                        help="kill rank 1 once it reported this step (default 15; checkpoints every 10)")
    parser.add_argument("--ddp_epochs", type=int, default=4,
                        help="epochs of the DDP tutorial, 32 steps each (default 4)")
    parser.add_argument("--ddp_kill_after", type=int, default=48,
                        help="kill rank 1 of the DDP tutorial after this many updates (default 48: "
                             "mid-epoch, its snapshot every epoch)")
    parser.add_argument("--clients", default="ddp,lightning,hf",
                        help="which clients to measure (default ddp,lightning,hf)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    add_json_flag(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    chosen = args.clients.split(",")
    unknown = [name for name in chosen if name not in CLIENTS]
    if unknown:
        print(f"frameworks_recovery: unknown client(s) {', '.join(unknown)}; known: {', '.join(CLIENTS)}",
              file=sys.stderr)
        sys.exit(2)
    figures: dict[str, Any] = {}
    for name, client in CLIENTS.items():
        if name not in chosen:
            figures[name] = None
            continue
        print(f"frameworks_recovery: {name} ...", file=sys.stderr, flush=True)
        figures[name] = measure(client, args)
    text = [f"{name:<10} steps redone {c['steps_redone']} (torchrun {c['torchrun_steps_redone']}), "
            f"back stepping after {c['recovery_s']:.2f} s (torchrun {c['torchrun_recovery_s']:.2f} s, "
            f"ratio {c['recovery_ratio']:.2f}, target <= 0.3), survivors kept their pids: "
            f"{c['survivors_kept_pids']}, final loss rel. diff {c['final_loss_rel_diff']:.2g} (target <= 1e-4)"
            for name, c in figures.items() if c is not None]
    steady = steady_ratio(args) if "ddp" in chosen else None
    if steady is not None:
        text.append(f"ddp steady state: tftrun with recovery.attach at {steady:.3f}x torchrun's "
                    f"updates per second (target >= 0.98)")
    emit({"clients": figures, "ddp_steady_ratio": steady}, args.json, text)


if __name__ == "__main__":
    main()
