"""CPU seconds per process in a fault-free run: tftrun's supervisor, scheduler and workers
beside torchrun's agent and workers, on the same job in the same invocation.

    PYTHONPATH=. python bench/cpu_usage.py [--workers 4] [--steps 300] [--rounds 2] [--json]

Runs the main job (templates/mnist/train.py, ``--max_steps``, a small synthetic set, no
checkpoint within the run) under each launcher, rounds alternating, and samples every
process of the launcher's tree with psutil every 0.1 s; a process's figure is its last
sample (user + system seconds), so one that lives less than a sample may be missed.
Reports, per launcher, the median over rounds of: wall seconds of the job, CPU seconds of
the launcher's own process (tftrun's supervisor, torchrun's agent), of the scheduler (and
its share of one core), of all workers together, and the launcher-side total (everything
but the workers), with the ratios tftrun / torchrun. Issue 16, part 4: steady state
≥ 0.98x torchrun's steps/s; what tftrun's own processes take from the workers' cores is
the part of that gap this bench sees. Run by hand; not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from common import add_json_flag, emit, median, ratio, tftrun_cmd, torchrun_cmd

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "mnist" / "train.py"
SAMPLE_EVERY = 0.1


def role_of(process_cmdline: list[str], is_root: bool) -> str:
    """launcher | scheduler | fork_server | worker | other, from a process's command line
    (a process forked by the fork server shows its own once it runs: until then, and once
    a zombie, it reads as other)."""
    if is_root:
        return "launcher"
    text = " ".join(process_cmdline)
    if "recovery.control.scheduler" in text:
        return "scheduler"
    if "--fork-server" in text:
        return "fork_server"
    if str(TEMPLATE) in text:
        return "worker"
    return "other"


def run_once(make_cmd: Callable[..., list[str]], workers: int, steps: int) -> dict[str, Any]:
    """One run of the job: wall seconds and CPU seconds by role."""
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        cmd = make_cmd(workers, Path(tmp) / "logs", str(TEMPLATE), f"--max_steps={steps}",
                       "--synthetic_size=4096", f"--save_steps={steps * 10}", "--log_every=100000")
        started = time.monotonic()
        root = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                cwd=tmp)
        seen: dict[int, tuple[str, float]] = {}
        tree = psutil.Process(root.pid)
        while root.poll() is None:
            for process in [tree, *tree.children(recursive=True)]:
                try:
                    with process.oneshot():
                        cpu = process.cpu_times()
                        role = role_of(process.cmdline(), process.pid == root.pid)
                    if role in ("other", "fork_server") and process.pid in seen:
                        role = seen[process.pid][0]  # as first seen, or as it ran
                    seen[process.pid] = (role, cpu.user + cpu.system)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            time.sleep(SAMPLE_EVERY)
        wall = time.monotonic() - started
        if root.returncode != 0:
            raise RuntimeError(f"{cmd[2]} exited {root.returncode}: {root.stderr.read()[-2000:]}")
    by_role: dict[str, float] = {}
    for role, seconds in seen.values():
        by_role[role] = by_role.get(role, 0.0) + seconds
    by_role["launcher_side"] = sum(v for k, v in by_role.items() if k not in ("worker",))
    return {"wall_s": wall, "cpu_s": by_role}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    roles = sorted({role for run in runs for role in run["cpu_s"]})
    return {"wall_s": median([r["wall_s"] for r in runs]),
            "cpu_s": {role: median([r["cpu_s"].get(role, 0.0) for r in runs]) for role in roles}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    add_json_flag(parser)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"tftrun": [], "torchrun": []}
    for _ in range(args.rounds):
        runs["tftrun"].append(run_once(tftrun_cmd, args.workers, args.steps))
        runs["torchrun"].append(run_once(torchrun_cmd, args.workers, args.steps))
        print("round done", file=sys.stderr, flush=True)
    tft, torch_ = summary(runs["tftrun"]), summary(runs["torchrun"])
    scheduler_s = tft["cpu_s"].get("scheduler", 0.0)
    result = {
        "workers": args.workers, "steps": args.steps, "rounds": args.rounds,
        "tftrun": tft, "torchrun": torch_,
        "scheduler_core_percent": 100.0 * scheduler_s / tft["wall_s"],
        "ratios": {"wall": ratio(tft["wall_s"], torch_["wall_s"]),
                   "launcher": ratio(tft["cpu_s"].get("launcher", 0.0), torch_["cpu_s"].get("launcher", 0.0)),
                   "launcher_side": ratio(tft["cpu_s"]["launcher_side"], torch_["cpu_s"]["launcher_side"]),
                   "workers": ratio(tft["cpu_s"].get("worker", 0.0), torch_["cpu_s"].get("worker", 0.0))},
        "runs": runs,
    }
    lines = [f"CPU seconds per process role, {args.workers} workers, {args.steps} steps, "
             f"median of {args.rounds} rounds",
             f"  {'':<10} {'wall s':>7} {'launcher':>9} {'scheduler':>9} {'workers':>8} {'launcher side':>13}"]
    for name, figures in (("tftrun", tft), ("torchrun", torch_)):
        cpu = figures["cpu_s"]
        lines.append(f"  {name:<10} {figures['wall_s']:7.2f} {cpu.get('launcher', 0.0):9.2f} "
                     f"{cpu.get('scheduler', 0.0):9.2f} {cpu.get('worker', 0.0):8.2f} {cpu['launcher_side']:13.2f}")
    lines.append("  ratios tftrun/torchrun: " + ", ".join(f"{k} {v:.3f}" for k, v in result["ratios"].items()))
    lines.append(f"  scheduler: {result['scheduler_core_percent']:.2f} % of one core over the job")
    emit(result, args.json, lines)


if __name__ == "__main__":
    main()
