"""One node's view of the others through the cluster store on node 0: the job identity,
each restart's rendezvous, the restart-all count and the job's end (recovery/control/nodes.py).
Every call is bounded: while node 0's scheduler is down a read answers ``None`` and the
caller carries on with what it knew. Anyone may write these keys, so a value that is not
the job's reads as unset too, and is reported."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from launcher.errors import ConfigError
from recovery import env as names
from recovery.ckpt.durable import write_atomic
from recovery.ckpt.layout import SCHEDULER_DIR
from recovery.control.files import StateFile
from recovery.control.nodes import (
    END_KEY,
    JOB_KEY,
    MAX_VALUE_BYTES,
    OVER_KEY,
    RESTART_KEY,
    BadValue,
    JobIdentity,
    beat_key,
    job_names,
    join_key,
    left_key,
    parse_address,
    parse_job,
    parse_nodes,
    raise_counter,
    read_signed,
    rendezvous_key,
    round_key,
    stored_at,
)
from recovery.control.rpc import port_open
from recovery.control.signing import job_key, sign_value
from recovery.control.tcpstore_client import StoreError, TCPStoreClient, ValueTooLarge
from recovery.control.throttle import Throttle

__all__ = ["NodeLink", "NodeWatch", "Beat", "NodeKeys", "local_address_towards", "save_job",
           "saved_job", "job_still_waited_for", "TIMEOUT", "JOB_FILE"]

logger = logging.getLogger(__name__)

JOB_FILE = "job.json"
"""Node 0's job identity, beside the scheduler's state: a returning node 0 takes it back."""
TIMEOUT = 2.0
_POLL = 0.1
WRONG_TOKEN_AFTER = 5.0
"""Seconds ``tft/job`` may fail its check in a row before a joining node takes its own
token for wrong: node 0's scheduler soon puts back a value a stranger overwrote."""
Report = Callable[[str, str, int], None]
"""``report(key, why, count)``: ``count`` values of ``key`` were refused, the latest for ``why``."""
T = TypeVar("T")


@dataclass(frozen=True)
class Beat:
    """One beat of a node's tftrun (``tft/node/<K>/beat``): a count that only rises, and
    the group restart of an elastic job the node waits to join (None: none)."""

    count: int
    joining: int | None = None

    def __str__(self) -> str:
        return str(self.count) if self.joining is None else f"{self.count} {self.joining}"


@dataclass(frozen=True)
class NodeKeys(Generic[T]):
    """One key of each of some nodes, as read: the values that verified, and the nodes
    whose key held one that did not."""

    found: Mapping[int, T]
    refused: frozenset[int] = frozenset()


def local_address_towards(host: str, port: int) -> str:
    """The address of the local interface that routes to ``host`` (no packet is sent:
    a UDP socket's ``connect`` only picks the route)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(infos[0][4])
            return str(probe.getsockname()[0])
    except OSError as err:
        raise ConfigError(f"--master_addr {host}: no route to it from this node "
                          f"({err.strerror or err}); give --node_addr") from None


def save_job(recovery_path: Path, job: JobIdentity) -> None:
    """Keep node 0's job identity in its recovery path (mode 0600), so that a returning
    node 0 (``--is_recover=1``) serves the same job."""
    path = recovery_path / SCHEDULER_DIR / JOB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda file: file.write(job.to_json().encode()))
    path.chmod(0o600)


def saved_job(recovery_path: Path) -> JobIdentity | None:
    """The identity :func:`save_job` kept, or ``None``."""
    try:
        return JobIdentity.from_json((recovery_path / SCHEDULER_DIR / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None


def job_still_waited_for(recovery_path: Path, node_time_out: float,
                         now: float) -> JobIdentity | None:
    """The job a node 0 started again (no ``--is_recover``) should return to; None: a new one.
    The others still wait while the scheduler's state is of that job, not ``finished``, and
    younger than ``--node_time_out`` (after which they end the job), so that an older crashed
    job is never resumed by accident."""
    job = saved_job(recovery_path)
    state_file = StateFile(recovery_path)
    try:
        age = now - state_file.path.stat().st_mtime
        state = state_file.load()
    except (OSError, ValueError):
        return None
    if (job is None or state is None or state.get("finished")
            or state.get("run_id") != job.run_id or not 0 <= age <= node_time_out):
        return None
    return job


class NodeLink:
    """This node's supervisor's client of the cluster store at ``host:port``. ``tft/job`` is
    signed with ``token``, the other keys with a key of ``run_id`` and ``epoch`` (``run_id``
    empty before the job is known). ``report`` is told of refused values; ``alert`` (``report``
    if None) of refused beats and joins, and what :meth:`alert` says."""

    def __init__(self, host: str, port: int, token: str, run_id: str = "", epoch: str = "",
                 report: Report | None = None, alert: Report | None = None) -> None:
        self._host, self._port = host, port
        self._token = token
        self._key = job_key(token, run_id, epoch)
        self._report = report
        self._alert = alert or report
        self._refusals: dict[str, Throttle] = {}
        self._client: TCPStoreClient | None = None
        self.reachable = True
        """Whether the last call reached the store."""

    def wait_for_job(self, timeout: float,
                     wrong_token_after: float = WRONG_TOKEN_AFTER) -> JobIdentity:
        """Wait up to ``timeout`` s for node 0's scheduler to publish the job; ConfigError
        when it does not, or when :data:`JOB_KEY` has not verified with this node's token
        for ``wrong_token_after`` s (node 0 was given another token)."""
        deadline = time.monotonic() + timeout
        bad_since: float | None = None
        while True:
            job, problem = None, None
            for where in reversed(job_names(self._token)):  # the keyed name first
                try:
                    job = self._job_at(where)
                except (BadValue, ValueTooLarge) as err:  # told below, in one line
                    problem = problem or str(err)
                if job is not None:
                    return job
            if problem is None:
                bad_since = None
            elif bad_since is None:
                bad_since = time.monotonic()
            elif time.monotonic() - bad_since > wrong_token_after:
                raise ConfigError(f"{names.TFT_JOB_TOKEN} is not the one node 0 at "
                                  f"{self._where()} was given (its {JOB_KEY} does not "
                                  f"verify): give every node of the job the same secret")
            if time.monotonic() > deadline:
                raise ConfigError(f"node 0's scheduler at {self._where()} did not come up "
                                  f"within --cluster_time_out={timeout:g}s")
            time.sleep(_POLL * 5)

    def _job_at(self, where: str) -> JobIdentity | None:
        """The job's identity stored under ``where``; ``None``: unset. Raises BadValue,
        ValueTooLarge."""
        stored = self._with_client(lambda client: client.peek(where, MAX_VALUE_BYTES))
        return None if stored is None else parse_job(self._token, stored)

    def publish_rendezvous(self, restart_count: int, host: str, port: int) -> None:
        """Node 0: where the workers of group restart ``restart_count`` meet."""
        self._write(rendezvous_key(restart_count), f"{host}:{port}")

    def rendezvous(self, restart_count: int, timeout: float) -> tuple[str, int] | None:
        """Where the workers of group restart ``restart_count`` meet, once node 0 said;
        ``None`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (where := self._read(rendezvous_key(restart_count), parse_address)) is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(_POLL)
        return where

    def restart_all(self, restart_count: int) -> None:
        """This node starts group restart ``restart_count``: the others follow."""
        for _attempt in range(2):
            try:
                self._with_client(lambda client: raise_counter(client, self._key, RESTART_KEY,
                                                               restart_count))
                return
            except ValueTooLarge as err:  # unreadable, so not comparable: removed
                self._refused(RESTART_KEY, str(err))
                self._with_client(lambda client: client.delete_key(
                    stored_at(self._key, RESTART_KEY)))

    def restarts_started(self) -> int | None:
        """The highest group restart any node started; ``None``: unknown just now."""
        return self._read(RESTART_KEY, _count)

    def beat(self, node_rank: int, beat: Beat) -> None:
        """This node's tftrun is alive."""
        self._write(beat_key(node_rank), str(beat))

    def beats(self, node_ranks: range | list[int]) -> NodeKeys[Beat]:
        """The latest beat of each node of ``node_ranks`` that beat (none when the store
        cannot be reached)."""
        return self._read_nodes({node: beat_key(node) for node in node_ranks}, _beat)

    def join_round(self, restart_count: int, node_rank: int) -> None:
        """This node joins group restart ``restart_count`` of an elastic job."""
        self._write(join_key(restart_count, node_rank), str(node_rank))

    def joined(self, restart_count: int, node_ranks: range | list[int]) -> NodeKeys[int]:
        """The nodes of ``node_ranks`` that joined group restart ``restart_count``."""
        return self._read_nodes({node: join_key(restart_count, node) for node in node_ranks},
                                _count)

    def alert(self, key: str, why: str) -> None:
        """Report something wrong with ``key`` that its value alone does not show (a join
        hidden, a beat replayed), like a refused beat or join."""
        self._refused(key, why, alert=True)

    def close_round(self, restart_count: int, nodes: tuple[int, ...]) -> None:
        """Node 0: group restart ``restart_count`` runs on ``nodes``."""
        self._write(round_key(restart_count), ",".join(map(str, nodes)))

    def round_nodes(self, restart_count: int) -> tuple[int, ...] | None:
        """The nodes group restart ``restart_count`` runs on, once node 0 closed it."""
        return self._read(round_key(restart_count), parse_nodes)

    def end(self, reason: str) -> None:
        """The job ends on every node, for ``reason``."""
        self._write(END_KEY, reason)

    def ended(self) -> str | None:
        """Why another node ended the job, if one did."""
        return self._read(END_KEY, str)

    def over(self, value: str) -> None:
        """Node 0: the job ended (``value``: launcher/nodes/job_end.py)."""
        self._write(OVER_KEY, value)

    def ended_on_node_0(self) -> str | None:
        """What node 0 said of the job's end, once it ended."""
        return self._read(OVER_KEY, str)

    def leave(self, node_rank: int) -> None:
        """This node ends: node 0 waits for it no more."""
        self._write(left_key(node_rank), str(node_rank))

    def left(self, node_ranks: range | list[int]) -> frozenset[int]:
        """The nodes of ``node_ranks`` that ended."""
        return frozenset(node for node in node_ranks if self._read(left_key(node), _count) == node)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    # ----------------------------------------------------------------- the store
    def _where(self) -> str:
        return f"{self._host}:{self._port}"

    def _read(self, key: str, parse: Callable[[str], Any]) -> Any:
        """``parse`` of the job's value of ``key``; ``None`` when unset or not the job's."""
        try:
            return self._read_verified(key, parse)
        except BadValue as err:
            self._refused(key, str(err))
            return None

    def _read_nodes(self, keys: Mapping[int, str], parse: Callable[[str], T]) -> NodeKeys[T]:
        """``parse`` of each node's value of its key in ``keys``; a value that is not the
        job's is an alert, not an absence."""
        found: dict[int, T] = {}
        refused: set[int] = set()
        for node, key in keys.items():
            try:
                if (value := self._read_verified(key, parse)) is not None:
                    found[node] = value
            except BadValue as err:
                self._refused(key, str(err), alert=True)
                refused.add(node)
        return NodeKeys(found, frozenset(refused))

    def _read_verified(self, key: str, parse: Callable[[str], T]) -> T | None:
        """``parse`` of the job's value of ``key``; None when unset; BadValue when it holds
        anything else."""
        try:
            text = self._with_client(lambda client: read_signed(client, self._key, key))
            return None if text is None else parse(text)
        except (BadValue, ValueTooLarge, ValueError) as err:
            raise BadValue(str(err)) from None

    def _refused(self, key: str, why: str, alert: bool = False) -> None:
        throttle = self._refusals.setdefault(key, Throttle())
        if (count := throttle.note()) is not None:
            logger.warning("%s %d value(s) of %s in the cluster store at %s (latest: %s)",
                           "alert:" if alert else "refused", count, key, self._where(), why)
            if (tell := self._alert if alert else self._report) is not None:
                tell(key, why, count)

    def _write(self, key: str, value: str) -> None:
        self._with_client(lambda client: client.set(stored_at(self._key, key),
                                                    sign_value(self._key, key, value)))

    def _with_client(self, use: Any) -> Any:
        """``use(client)``, or None when the store cannot be reached just now; ValueTooLarge
        when a value was too long to read (the store was reached; the connection is dropped)."""
        try:
            if self._client is None:
                if not port_open(self._host, self._port):
                    self.reachable = False
                    return None
                self._client = TCPStoreClient(self._host, self._port, TIMEOUT)
            result = use(self._client)
        except ValueTooLarge:
            self._client = None
            self.reachable = True
            raise
        except StoreError as err:
            logger.debug("the cluster store at %s: %s", self._where(), err)
            self._client = None  # a broken connection is not reused: a new one next time
            self.reachable = False
            return None
        self.reachable = True
        return result


def _count(text: str) -> int:
    """A restart count. Raises BadValue."""
    if not text.isdigit():
        raise BadValue(f"not a count: {text[:80]!r}")
    return int(text)


def _beat(text: str) -> Beat:
    """A :class:`Beat` as written (``<count>`` or ``<count> <joining>``). Raises BadValue."""
    count, _, joining = text.partition(" ")
    return Beat(_count(count), _count(joining) if joining else None)


class NodeWatch:
    """Since when the same absence of another node has lasted, without a break: node 0 watches
    the other nodes' ranks, another node node 0's store; the policy ends the job once
    :attr:`since` is ``--node_time_out`` ago."""

    def __init__(self) -> None:
        self.missing = ""
        self.since: float | None = None

    def seen(self, missing: str, now: float) -> None:
        """``missing``: what is missing now (empty: nothing)."""
        if not missing:
            self.since = None
        elif self.since is None:
            self.since = now
        self.missing = missing
