"""The fork server (launcher/procs/fork_server.py): a forked worker is what a spawned one
is, as its script sees it, and as tftrun and the user's tools see it; a job goes on cold
when the server is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import events, run, spawn, spawned_pids, terminate, tftrun_cmd, wait_for, wait_for_event
from support.mnist import START

pytestmark = pytest.mark.timeout(240)

PROBE = textwrap.dedent('''
    """What a worker sees of itself, written to OUT/<rank>.json; then, by the second
    argument: end 0, exit 3, or raise."""
    import ctypes, gc, json, os, sys
    import psutil

    rank = int(os.environ["RANK"])
    libc = ctypes.CDLL(None)
    deathsig = ctypes.c_int()
    libc.prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
    me = psutil.Process()
    seen = {
        "name": __name__, "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(),
        "cmdline": me.cmdline()[1:], "parent": me.parent().cmdline()[1:3],
        "session_leader": os.getsid(0) == os.getpid(),
        "group_leader": os.getpgid(0) == os.getpid(),
        "deathsig": deathsig.value, "stdin": os.readlink("/proc/self/fd/0"),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2),
        "write_through": sys.stdout.write_through, "nice": os.nice(0),
        "rank": rank, "world": os.environ["WORLD_SIZE"],
        "proc_environ_is_os_environ": me.environ() == dict(os.environ),
        "frozen": gc.get_freeze_count(),
    }
    with open(os.path.join(sys.argv[1], f"{rank}.json"), "w") as out:
        json.dump(seen, out)
    if sys.argv[2] == "exit3":
        sys.exit(3)
    if sys.argv[2] == "raise":
        raise ValueError("probe failed on purpose")
''')


def _run_probe(folder: Path, fork_server: bool, module: bool = False, workers: int = 2,
               end: str = "end0") -> dict[str, Any]:
    """Run the probe; what each worker saw, the job's status, how each rank ended, rank
    0's log, and whether the workers were forked. Paths under ``folder`` read ``F``."""
    (folder / "out").mkdir(parents=True)
    (folder / "probe.py").write_text(PROBE)
    entry = ("-m", "probe") if module else (str(folder / "probe.py"),)
    result = run(tftrun_cmd(f"--worker_num={workers}", "--max_restarts=0",
                            f"--log_dir={folder / 'logs'}", f"--fork_server={fork_server}",
                            *entry, str(folder / "out"), end), timeout=START, cwd=folder)
    seen = json.loads(json.dumps({r: json.loads((folder / "out" / f"{r}.json").read_text())
                                  for r in range(workers)}).replace(str(folder), "F"))
    return {"status": result.returncode, "seen": seen,
            "exits": {e["rank"]: e.get("exitcode") for e in events(folder / "logs", "exit")
                      if e["role"] == "worker"},
            "log": (folder / "logs" / "worker_0.log").read_text().split("====\n", 1)[1]
            .replace(str(folder), "F"),
            "forked": [bool(e.get("forked")) for e in events(folder / "logs", "spawn")
                       if e["role"] == "worker"]}


@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
def test_a_forked_worker_sees_what_a_spawned_one_sees(tmp_path: Path, module: bool) -> None:
    """The same probe, forked and spawned: the same ``__main__``, argv, sys.path,
    working folder, command line, parent (tftrun), session, parent-death signal, stdin,
    open files, unbuffered output, priority, and the environment other processes read in
    /proc (psutil's, tftctl's check of a scheduler); only the objects the server made
    before the fork are frozen."""
    forked = _run_probe(tmp_path / "forked", True, module)
    spawned = _run_probe(tmp_path / "spawned", False, module)
    assert forked["forked"] == [True] * 2 and spawned["forked"] == [False] * 2
    assert forked["status"] == spawned["status"] == 0
    # What the server's warm-up made is frozen (launcher/procs/spare.py: warm_up): the
    # only difference a forked worker may show.
    for rank in "01":
        assert spawned["seen"][rank].pop("frozen") == 0
        assert forked["seen"][rank].pop("frozen") > 100_000
    assert forked["seen"] == spawned["seen"]
    assert forked["seen"]["0"]["cmdline"][:2] == ["-u", "-m" if module else "F/probe.py"]
    assert forked["seen"]["0"]["parent"] == ["-m", "launcher.cli.tftrun"]
    assert forked["seen"]["1"]["proc_environ_is_os_environ"]


def test_a_forked_workers_exit_status_and_traceback_are_the_scripts(tmp_path: Path) -> None:
    """``sys.exit(3)`` in a forked worker is its status 3 and the job's; an uncaught
    exception is status 1, with the traceback Python prints for the script alone (none
    of the fork server's or runpy's frames)."""
    exited = _run_probe(tmp_path / "exit3", True, workers=1, end="exit3")
    assert exited["forked"] == [True] and exited["exits"] == {0: 3} and exited["status"] == 3
    raised = _run_probe(tmp_path / "raise", True, workers=1, end="raise")
    assert raised["forked"] == [True] and raised["exits"] == {0: 1} and raised["status"] == 1
    lines = raised["log"].splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith('  File "F/probe.py", line ')
    assert lines[-1] == "ValueError: probe failed on purpose"
    assert len(lines) == 4


def test_a_job_goes_on_cold_once_the_fork_server_is_gone(tmp_path: Path) -> None:
    """The fork server killed while the job runs: a killed rank is relaunched as a fresh
    process (its spawn event without ``forked``), and the job ends 0."""
    log_dir = tmp_path / "logs"
    script = tmp_path / "wait.py"
    script.write_text(textwrap.dedent('''
        import os, sys, time
        if os.environ["TFT_INCARNATION"] == "0" and os.environ["RANK"] == "1":
            time.sleep(300)  # killed by the test
        open(os.path.join(sys.argv[1], os.environ["RANK"] + "." + os.environ["TFT_INCARNATION"]), "w").close()
    '''))
    proc = spawn(tftrun_cmd("--worker_num=2", f"--log_dir={log_dir}", "--rejoin_cooldown=0",
                            str(script), str(tmp_path)))
    try:
        pids = wait_for(lambda: (p := spawned_pids(log_dir)) and len(p) == 2 and p, START,
                        "both workers forked")
        server = _fork_server_pid(log_dir)
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{server}") or _zombie(server), START,
                 "the fork server gone")
        os.kill(pids[1], signal.SIGKILL)
        relaunch = wait_for_event(log_dir, START, "rank 1 relaunched", event="spawn", rank=1,
                                  incarnation=1)
        assert "forked" not in relaunch
        assert proc.wait(timeout=START) == 0
    finally:
        terminate(proc)
    assert (tmp_path / "1.1").exists()


def _fork_server_pid(log_dir: Path) -> int:
    """The job's fork server, by the pid its ready line gives: a worker just forked still bears
    the server's command line until it retitles itself."""
    [pid] = re.findall(r"^tftrun fork server pid=(\d+): ", (log_dir / "fork_server.log").read_text(), re.M)
    return int(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


GPU_JOB = textwrap.dedent('''
    """A plain torchrun script on CUDA and NCCL; incarnation 0 waits to be killed after
    its first all_reduce, incarnation 1 ends. Writes OUT/<incarnation>.json."""
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    # A child forked from a process that had made a CUDA context could not make its own.
    bad_fork = torch.cuda._is_in_bad_fork()
    started = time.time()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    total = torch.ones(1, device="cuda")
    dist.all_reduce(total)
    torch.cuda.synchronize()
    incarnation = os.environ["TFT_INCARNATION"]
    with open(os.path.join(sys.argv[1], incarnation + ".json"), "w") as out:
        json.dump({"bad_fork": bad_fork, "sum": total.item(),
                   "seconds": time.time() - started}, out)
    if incarnation == "0":
        time.sleep(300)  # killed by the test
    dist.destroy_process_group()
''')


@pytest.mark.gpu
def test_a_forked_worker_and_its_forked_relaunch_make_their_cuda_context_and_nccl_group(
        tmp_path: Path) -> None:
    """The fork server imports torch (with its CUDA libraries) but never touches CUDA, so
    a forked worker, and the relaunch forked after a ``kill -9``, each make their own CUDA
    context and NCCL communicator. Prints the seconds each took."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    log_dir = tmp_path / "logs"
    script = tmp_path / "gpu_job.py"
    script.write_text(GPU_JOB)
    proc = spawn(tftrun_cmd("--worker_num=1", f"--log_dir={log_dir}", "--rejoin_cooldown=0",
                            str(script), str(tmp_path)))
    try:
        wait_for(lambda: (tmp_path / "0.json").exists(), START, "incarnation 0 past its all_reduce")
        os.kill(spawned_pids(log_dir)[0], signal.SIGKILL)
        assert proc.wait(timeout=START) == 0, (log_dir / "worker_0.log").read_text()[-2000:]
    finally:
        terminate(proc)
    spawns = [e for e in events(log_dir, "spawn") if e["role"] == "worker"]
    assert [(e["incarnation"], e.get("forked")) for e in spawns] == [(0, True), (1, True)]
    for incarnation in (0, 1):
        seen = json.loads((tmp_path / f"{incarnation}.json").read_text())
        print(f"incarnation {incarnation}: CUDA context and NCCL group in {seen['seconds']:.3f} s")
        assert (seen["bad_fork"], seen["sum"]) == (False, 1.0)
