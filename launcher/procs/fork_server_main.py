"""The node's fork server, run as ``python -u -P fork_server_main.py --fork-server SOCKET_FD SUPERVISOR_PID ROOM``:
it pays ``import torch`` once, then forks each worker, which runs its script as ``__main__``. Started by path
with ``-P`` and importing only the standard library, torch and recovery, so a ``recovery/`` in the working folder
is never imported and the script sees a fresh ``sys.path``."""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import sys
import time
import warnings
from types import TracebackType
from typing import Any

READY = "warm"
"""The key of the server's first message, and the word of its log's ready line."""
FORK_SERVER = "--fork-server"
"""The server's first argument: what names it among a node's processes (``ps``)."""
CUDA_UNTOUCHED = "CUDA initialised: no"
"""In the fork server's ready line (its log): the warm-up left CUDA uninitialised."""
CUDA_INITIALISED = "CUDA was initialised while warming up, so a worker forked from here could not use it"
"""Why a fork server refuses to serve (its log); workers then start as fresh processes."""
MAX_MESSAGE = 1 << 20
"""The largest request the fork server reads (a worker's environment is a few KiB)."""
MAX_FDS = 4
"""The most open files a request passes to the process it forks (the scheduler's store socket)."""
ADOPTION_WAIT = 5.0
"""Seconds a forked worker waits to be re-parented to the supervisor before it gives up."""
_PR_SET_PDEATHSIG = 1


def warm_up() -> None:
    """Import what every worker imports, step an optimizer once, then ``gc.freeze()`` the result, so that a
    forked worker's collections never write to (and so copy) the pages it shares with the server."""
    import torch
    import torch.distributed  # noqa: F401

    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    torch.optim.SGD([param], lr=0.1).step()
    # The library that only the scripts using recovery import (main() imported recovery already).
    import recovery.ckpt.checkpoint  # noqa: F401
    import recovery.train.elastic  # noqa: F401
    from recovery.env import TFT_PRELOAD

    preload(os.environ.get(TFT_PRELOAD, ""))
    gc.freeze()


def preload(specs: str) -> None:
    """Import ``TFT_PRELOAD``'s modules (``module[:name,...]`` joined by ``;``, launcher/procs/preload.py); one
    that fails is left to the worker, which meets the same error itself."""
    for spec in filter(None, specs.split(";")):
        module, _, names = spec.partition(":")
        try:
            imported = importlib.import_module(module)
            for name in filter(None, names.split(",")):
                if name != "*":
                    getattr(imported, name)
        except Exception as err:  # noqa: BLE001 - any import error is the worker's to meet
            print(f"tftrun fork server: preloading {spec} failed: {err!r}", flush=True)
        else:
            print(f"tftrun fork server: preloaded {spec}", flush=True)


def refuse_initialised_cuda() -> None:
    """End the server if its warm-up initialised CUDA: a process forked from one that did cannot use CUDA."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit(f"tftrun fork server pid={os.getpid()}: {CUDA_INITIALISED}; not serving")


def become(message: dict[str, Any], interpreter: list[str]) -> None:
    """Turn this process into the worker ``message`` describes and run its script; ``interpreter``: this
    Python's own ``sys.path`` entries."""
    from recovery.python_path import PYTHONPATH, worker_sys_path
    from recovery.safe_files import open_append

    log_fd = open_append(message["log"])
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(message["env"])
    restamp_environ(message["env"])
    os.chdir(message["cwd"])
    sys.argv = list(message["argv"])
    target = sys.argv[0]
    if not message.get("safe_path"):  # a worker, not tftrun's own module: the user's sys.path
        # What `python -m module` puts first: the working folder; `python script.py`: the
        # script's (real) folder.
        first = os.getcwd() if message.get("module") else os.path.dirname(os.path.realpath(target))
        sys.path[:] = worker_sys_path(first, os.environ.get(PYTHONPATH, ""), interpreter)
    try:
        if message.get("module"):
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise  # an exception that is also a SystemExit ends with its code, as in Python
    except Exception as error:  # noqa: BLE001 - reported as Python reports it, status 1
        trace = _script_frames(error.__traceback__)
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        sys.exit(1)


def _script_frames(trace: TracebackType | None) -> TracebackType | None:
    """``trace`` without this program's and runpy's frames: the traceback ``python script.py`` shows."""
    ours = {__file__, getattr(runpy, "__file__", None), "<frozen runpy>"}
    while trace is not None and trace.tb_frame.f_code.co_filename in ours:
        trace = trace.tb_next
    return trace


def serve(sock: socket.socket, supervisor: int) -> dict[str, Any] | None:
    """Say the server is warm, then fork a worker for each request until EOF; None in the server at EOF, the
    worker's message in each forked worker. A worker is forked twice over, so that it is re-parented at once to
    the supervisor (a child subreaper), which reaps it; it leads its own session before its pid is answered, so
    that a signal to its process group reaches it from the first."""
    sock.send(json.dumps({READY: os.getpid()}).encode())
    while True:
        data, fds, _flags, _address = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        if not data:
            return None
        message = json.loads(data)
        try:
            pid = _fork_worker(sock, supervisor)
        except OSError as err:
            sock.send(json.dumps({"error": f"fork: {err}"}).encode())
            pid = -1
        if pid is None:  # in the worker: the files passed with the request are its own
            message["env"].update(zip(message.get("fd_env", ()), map(str, fds)))
            return message
        for fd in fds:
            os.close(fd)
        if pid > 0:
            sock.send(json.dumps({"pid": pid}).encode())


def _fork_worker(sock: socket.socket, supervisor: int) -> int | None:
    """Fork a worker; its pid in the server, None in the worker itself."""
    read_fd, write_fd = os.pipe()
    middle = _fork()
    if middle == 0:  # the middle process: fork the worker and end, whatever happens
        try:
            worker = _fork()
        except OSError:
            os._exit(1)
        if worker != 0:
            os._exit(0)
        os.close(read_fd)
        sock.close()
        os.setsid()
        os.write(write_fd, str(os.getpid()).encode())
        os.close(write_fd)
        _wait_for_adoption(supervisor)
        return None
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(middle, 0)
    if not answer:
        raise OSError("the forked worker ended before it started")
    return int(answer)


def _fork() -> int:
    """``os.fork`` without Python's warning about forking with threads: torch's import leaves one native
    thread, which holds no lock the worker needs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _wait_for_adoption(supervisor: int) -> None:
    """In a forked worker: once re-parented to the supervisor, die with it as a spawned worker does
    (``PR_SET_PDEATHSIG``)."""
    deadline = time.monotonic() + ADOPTION_WAIT
    while os.getppid() != supervisor:
        if time.monotonic() > deadline:
            os._exit(1)  # not adopted: the supervisor is not a subreaper, or is gone
        time.sleep(0.0005)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor:
        os._exit(1)  # the supervisor died before the prctl took effect


def restamp_environ(env: dict[str, str]) -> None:
    """Make ``/proc/<pid>/environ`` read ``env``, as a spawned process's would (tftctl checks a scheduler by
    it), by writing over the first environment's memory. Call it only once ``os.environ`` was replaced, so no
    C variable points there; what does not fit the room is left out of that view only."""
    start, end = _proc_range(47)  # env_start, env_end (proc(5))
    block, room = bytearray(), end - start - 1
    for name, value in env.items():
        entry = f"{name}={value}".encode(errors="surrogateescape") + b"\0"
        if len(block) + len(entry) <= room:
            block += entry
    ctypes.memmove(start, bytes(block.ljust(end - start, b"\0")), end - start)


def _proc_range(index: int) -> tuple[int, int]:
    """Two addresses of ``/proc/self/stat`` (fields ``index + 3`` and ``index + 4``)."""
    with open("/proc/self/stat", "rb") as file:
        stat = file.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[index]), int(fields[index + 1])


def retitle(title: str) -> None:
    """Make this process's command line (``ps``, ``pgrep -f``) read ``title``, written over the server's own
    arguments (``ROOM`` bytes long; a longer title is cut). The last byte stays non-zero, which tells the
    kernel to read the title up to its NUL."""
    start, end = _proc_range(45)  # arg_start, arg_end (proc(5))
    room = end - start
    data = title.encode()[:room - 2] + b"\0"
    ctypes.memmove(start, data.ljust(room, b" "), room)


def main() -> None:
    """Warm up, then serve; in a forked worker, become it."""
    started = time.monotonic()
    # Started with -P and PYTHONPATH's absolute entries only (launcher/procs/spec.py,
    # OWN_PYTHON): neither this file's folder nor the working folder is on sys.path.
    from recovery.python_path import PYTHONPATH, interpreter_sys_path
    from recovery.quick_exit import exit_now

    interpreter = interpreter_sys_path(sys.path, os.environ.get(PYTHONPATH, ""))
    warm_up()
    refuse_initialised_cuda()
    with open("/proc/self/maps") as maps:  # the CUDA driver's library is mapped once a CUDA call loaded it
        driver = "yes" if any("/libcuda.so" in line for line in maps) else "no"
    print(f"tftrun fork server pid={os.getpid()}: {READY} after {time.monotonic() - started:.2f}s; "
          f"{CUDA_UNTOUCHED}; CUDA driver loaded: {driver}", flush=True)
    with socket.socket(fileno=int(sys.argv[2])) as sock:
        message = serve(sock, int(sys.argv[3]))
    if message is None:
        exit_now(0)  # the supervisor is done with it: nothing to tear down
    retitle(message["title"])
    # Each worker its own numpy global seed, as a fresh process has; the server's was drawn once.
    if (numpy_random := sys.modules.get("numpy.random")) is not None:
        numpy_random.seed()
    become(message, interpreter)


if __name__ == "__main__":
    main()
