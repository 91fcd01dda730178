"""Recovery of scripts that keep their own loop: tftrun against torchrun, in one invocation.

For each client (a Lightning job and a Hugging Face Trainer job: the 2-rank jobs of
tests/integration/test_frameworks.py, a checkpoint of their own every 10 steps, a step of
about 50 ms), three runs: a fault-free one under tftrun; one under tftrun with the
client's last-words callback; one under torchrun (``--standalone --max_restarts=1``, the
script without the callback: torchrun's behaviour). In each faulty run rank 1 is killed
with ``kill -9`` once it reported step ``--kill_after`` (between two checkpoints). Per
client it reports:

* ``steps_redone`` / ``torchrun_steps_redone``: the last step completed before the kill
  minus the step the restart resumed at (target 0; torchrun redoes up to the interval);
* ``recovery_ratio``: the time from the kill until every rank completed a step again,
  tftrun's over torchrun's (target ≤ 0.3);
* ``survivors_kept_pids``: whether rank 0's process after the kill is the one before;
* ``final_loss_rel_diff``: tftrun's final loss against the fault-free run's, relative
  (target ≤ 1e-4).

``--json`` prints, as its last line, ``{"clients": {"ddp": C, "lightning": C, "hf": C},
"ddp_steady_ratio": float}``. The ``ddp`` client (a plain DDP script) and the steady-state
ratio belong to the DDP work of the same issue: :data:`CLIENTS` has a ``None`` in its
place, which prints as ``null``, until that client is added there.

Run: ``PYTHONPATH=. python3 bench/frameworks_recovery.py [--json]`` (needs
``pip install -e '.[frameworks]'``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import add_json_flag, emit, ratio, tftrun_cmd, torchrun_cmd

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "bin"
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""A fresh store for each torchrun attempt: a restarted group otherwise meets the previous
attempt's keys (pytorch#135712; bench/fault_recovery.py does the same)."""
WORKERS = 2
KILLED_RANK = 1


@dataclass(frozen=True)
class Client:
    """A framework job: its script, and the file its own checkpoint of step 10 leaves."""

    script: str
    first_checkpoint: str


CLIENTS: dict[str, Client | None] = {
    "ddp": None,  # the plain DDP script's client: not measured here yet (prints null)
    "lightning": Client("lightning_tiny.py", "last.ckpt"),
    "hf": Client("hf_tiny.py", "checkpoint-10"),
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
        job = [str(JOBS / client.script), str(out), str(args.steps), f"--timing={timing}"]
        env = dict(os.environ)
        if system == "tftrun":
            cmd = tftrun_cmd(WORKERS, logs, *job, "--last-words",
                             extra=(f"--recovery_path={Path(tmp) / 'recovery'}",))
        else:
            cmd = torchrun_cmd(WORKERS, logs, *job, extra=("--standalone", "--max_restarts=1"))
            env.update(TORCHRUN_ENV)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killed_at = None
        try:
            if kill:
                killed_at = _kill_when_due(proc, out / client.first_checkpoint, timing, args)
            output, _ = proc.communicate(timeout=args.timeout)
        finally:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"{client.script} under {system} exited {proc.returncode}:\n{output[-3000:]}")
        return Run(_steps(timing), killed_at, float((timing / "loss_0.txt").read_text().split()[-1]))


def _kill_when_due(proc: subprocess.Popen[str], checkpoint: Path, timing: Path,
                   args: argparse.Namespace) -> float:
    """``kill -9`` rank 1 once the job's first checkpoint exists and rank 1 reported step
    ``--kill_after``; returns when."""
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and proc.poll() is None:
        records = _steps(timing).get(KILLED_RANK, [])
        if checkpoint.exists() and records and records[-1][0] >= args.kill_after:
            os.kill(records[-1][2], signal.SIGKILL)
            return time.time()
        time.sleep(0.01)
    raise RuntimeError(f"rank {KILLED_RANK} never reached step {args.kill_after}")


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
    torch_run = after_the_kill(run(client, "torchrun", args, kill=True))
    return {"steps_redone": tft["steps_redone"], "torchrun_steps_redone": torch_run["steps_redone"],
            "recovery_ratio": ratio(tft["recovery_s"], torch_run["recovery_s"]),
            "survivors_kept_pids": tft["survivors_kept_pids"],
            "final_loss_rel_diff": abs(faulty.loss - clean.loss) / abs(clean.loss),
            "recovery_s": tft["recovery_s"], "torchrun_recovery_s": torch_run["recovery_s"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="steps of each job (default 30)")
    parser.add_argument("--kill_after", type=int, default=15,
                        help="kill rank 1 once it reported this step (default 15; checkpoints every 10)")
    parser.add_argument("--clients", default="lightning,hf", help="which clients to measure (default lightning,hf)")
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
        if client is None or name not in chosen:
            figures[name] = None
            continue
        print(f"frameworks_recovery: {name} ...", file=sys.stderr, flush=True)
        figures[name] = measure(client, args)
    text = [f"{name:<10} steps redone {c['steps_redone']} (torchrun {c['torchrun_steps_redone']}), "
            f"back stepping after {c['recovery_s']:.2f} s (torchrun {c['torchrun_recovery_s']:.2f} s, "
            f"ratio {c['recovery_ratio']:.2f}, target <= 0.3), survivors kept their pids: "
            f"{c['survivors_kept_pids']}, final loss rel. diff {c['final_loss_rel_diff']:.2g} (target <= 1e-4)"
            for name, c in figures.items() if c is not None]
    emit({"clients": figures, "ddp_steady_ratio": None}, args.json, text)


if __name__ == "__main__":
    main()
