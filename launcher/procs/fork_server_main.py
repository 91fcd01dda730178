"""The node's fork server, run as ``python -u -P fork_server_main.py --fork-server
SOCKET_FD SUPERVISOR_PID ROOM`` (launcher/procs/fork_server.py is the supervisor's end).

It pays a worker's cold start once (``import torch``, the first optimizer step, which
imports ``torch._dynamo``, and the ``recovery`` library where it can be imported), then
forks every worker of the node from its warm interpreter, one per message on the socket
(:func:`serve`). The forked process becomes the worker the message describes
(:func:`become`): its output goes to the rank's log, ``os.environ`` is replaced by the
rank's, and the script runs as ``__main__``, so its exit status is the script's
(``sys.exit(n)`` gives n, an uncaught exception a traceback and 1).

Started by path, not with ``-m``, with ``-P`` and the absolute entries of ``PYTHONPATH``
only (a ``recovery/`` planted in the working folder is never imported here), and
importing nothing but the standard library, torch and recovery: the script finds
``sys.modules`` and ``sys.path`` as a fresh ``python -u script.py`` would, the user's whole
``PYTHONPATH`` included, apart from those being imported already.
"""

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
"""The most open files a request passes to the process it forks (the scheduler's one:
the store's listening socket, named by the environment variable ``fd_env`` gives)."""
ADOPTION_WAIT = 5.0
"""Seconds a forked worker waits to be re-parented to the supervisor before it gives up."""
_PR_SET_PDEATHSIG = 1


def warm_up() -> None:
    """Import what every worker imports, and build and step an optimizer once; then
    freeze what that made.

    Frozen, the objects of torch's import sit in the collector's permanent generation, so
    a forked worker's collections never walk them nor write to the pages it shares with
    the server, which the kernel would then copy. What the script makes is collected as
    in any process.
    """
    import torch
    import torch.distributed  # noqa: F401

    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    torch.optim.SGD([param], lr=0.1).step()
    try:
        # The library that only the scripts using recovery import.
        import recovery.ckpt.checkpoint  # noqa: F401
        import recovery.train.elastic  # noqa: F401
        from recovery.env import TFT_PRELOAD
    except ImportError:
        pass
    else:
        preload(os.environ.get(TFT_PRELOAD, ""))
    gc.freeze()


def preload(specs: str) -> None:
    """Import the frameworks the script imports (``TFT_PRELOAD``, made by
    launcher/procs/preload.py: ``module[:name,...]`` joined by ``;``); one that fails is
    left to the worker, which meets the same error itself."""
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
    """End the fork server (workers then start as fresh processes) if its warm-up
    initialised CUDA: a process forked from one that did cannot use CUDA itself."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit(f"tftrun fork server pid={os.getpid()}: {CUDA_INITIALISED}; not serving")


def cuda_driver_loaded() -> bool:
    """Whether the CUDA driver's library is mapped in this process (a CUDA call loads it)."""
    with open("/proc/self/maps") as maps:
        return any("/libcuda.so" in line for line in maps)


def become(message: dict[str, Any], interpreter: list[str]) -> None:
    """Turn this process into the worker that ``message`` describes and run its script;
    ``interpreter``: this Python's own ``sys.path`` entries
    (recovery/python_path.py, ``interpreter_sys_path``)."""
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
    """``trace`` without its first frames, this program's and runpy's: the traceback a
    script run by ``python`` shows."""
    ours = {__file__, getattr(runpy, "__file__", None), "<frozen runpy>"}
    while trace is not None and trace.tb_frame.f_code.co_filename in ours:
        trace = trace.tb_next
    return trace


def serve(sock: socket.socket, supervisor: int) -> dict[str, Any] | None:
    """The fork server: say it is warm, then fork a worker for each request until EOF.

    Returns None in the server (EOF: the supervisor closed the socket, or is gone); in
    each forked worker it returns that worker's message, to :func:`become`.

    A worker is forked twice over (server → a short-lived middle process → the worker),
    so that it is orphaned at once and re-parented to the supervisor, a child subreaper
    (launcher/procs/process.py): the supervisor reaps it and reads its exit status as it
    does for a process it started itself. The worker leads a session of its own before
    its pid is answered, so that a signal to its process group reaches it from the first.
    """
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
    """``os.fork``, without the warning Python 3.12 and later give for a process with
    threads: torch's import leaves one native thread, which holds no lock the worker
    needs (torch's DataLoader forks its workers from such processes too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _wait_for_adoption(supervisor: int) -> None:
    """In a forked worker: once the middle process is gone and the kernel has given this
    process to the supervisor, die with the supervisor as a spawned worker does
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
    """Make this process's ``/proc/<pid>/environ`` (psutil's ``environ()``, ``ps e``,
    tftctl's check that a scheduler is the job's) read ``env``, which ``os.environ`` now
    holds, as a spawned process's would: it is written over the memory that held this
    process's first environment, NUL-padded. Call it once ``os.environ`` was replaced:
    no variable of the C library points into that memory any more. What does not fit
    (the fork server leaves ``TFT_ENVIRON_ROOM`` of room) is left out of that view only."""
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
    """Make this process's command line (``ps``, ``pgrep -f``, psutil) read ``title``, as
    a spawned worker's would: it is written over the memory that held the server's own
    arguments (``ROOM`` bytes of padding made it long enough; a longer title is cut).
    The last byte is left non-zero, which tells the kernel to read the title up to its
    NUL, as for ``setproctitle``; its arguments are separated by spaces."""
    start, end = _proc_range(45)  # arg_start, arg_end (proc(5))
    room = end - start
    data = title.encode()[:room - 2] + b"\0"
    ctypes.memmove(start, data.ljust(room, b" "), room)


def main() -> None:
    started = time.monotonic()
    # Started with -P and PYTHONPATH's absolute entries only (launcher/procs/spec.py,
    # OWN_PYTHON): neither this file's folder nor the working folder is on sys.path.
    from recovery.python_path import PYTHONPATH, interpreter_sys_path

    interpreter = interpreter_sys_path(sys.path, os.environ.get(PYTHONPATH, ""))
    fork_server(int(sys.argv[2]), int(sys.argv[3]), started, interpreter)


def fork_server(sock_fd: int, supervisor: int, started: float, interpreter: list[str]) -> None:
    """Warm up at the workers' priority (they wait for it), then serve; in a forked
    worker, become it."""
    from recovery.quick_exit import exit_now

    warm_up()
    refuse_initialised_cuda()
    print(f"tftrun fork server pid={os.getpid()}: {READY} after {time.monotonic() - started:.2f}s; "
          f"{CUDA_UNTOUCHED}; CUDA driver loaded: {'yes' if cuda_driver_loaded() else 'no'}",
          flush=True)
    with socket.socket(fileno=sock_fd) as sock:
        message = serve(sock, supervisor)
    if message is None:
        exit_now(0)  # the supervisor is done with it: nothing to tear down
    retitle(message["title"])
    _reseed_numpy()
    become(message, interpreter)


def _reseed_numpy() -> None:
    """numpy's global generator, if the server imported it, was seeded once in the server:
    each worker draws its own seed, as a fresh process would (Python's ``random`` is
    reseeded at fork by Python itself; torch's default seed is fixed in every process)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


if __name__ == "__main__":
    main()
