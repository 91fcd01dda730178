"""Beats per node: what a node's supervisor keeps of its ranks' heartbeats, free of I/O.

The supervisor sends one signed ``node_beat`` per interval for all its ranks (docs/protocol.md) and
keeps the scheduler's answer for each rank until that rank's next local beat. The scheduler judges the
node's silence, the supervisor each rank's: a rank silent past the heartbeat timeout goes out at once.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

from recovery.control.requests import NODE_BEAT_RANKS
from recovery.control.stragglers import merge_summaries

__all__ = ["NodeBeats", "RankBeat", "encode", "decode", "MAX_LOCAL_BYTES", "BEAT_BYTES"]

MAX_LOCAL_BYTES = 65_536
"""The largest message on the local socket (a reply with injections is far smaller)."""
BEAT_BYTES = 12_000
"""A ``node_beat``'s ranks take at most about this many bytes, well under a request's 16 KiB."""
_PAST_TIMEOUT = 0.001
"""A rank's own deadline fires this far past its heartbeat timeout (the scheduler
compares strictly)."""
_IDENTITY = ("node_id", "pid", "incarnation", "host", "rank")
_CHANGES = ("ok", "generation", "fault_at")
"""What in a rank's answer is news for it (and makes :attr:`NodeBeats.news` move)."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def decode(data: bytes) -> dict[str, Any] | None:
    """The JSON object in ``data``; ``None`` when it is not one."""
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


@dataclass
class RankBeat:
    """One local rank (one connection) as its supervisor knows it."""

    fields: dict[str, Any]
    """Its identity (node_id, pid, incarnation, host, rank)."""
    heard_at: float
    step: int | None = None
    phase: str | None = None
    registering: bool = False
    """A registration waits for the next beat."""
    whole: bool = False
    """It registered to train in whole generations only."""
    ready: bool | None = None
    """What it last said of its readiness (None: nothing; a relaunched rank registers unready)."""
    urgent: bool = False
    """Something the scheduler must hear at once waits for the next beat: a registration, a change of
    readiness, or a step-time summary its rank sent as urgent."""
    answer: dict[str, Any] | None = None
    """The scheduler's latest answer about it (None: none yet)."""
    injections: list[Any] = field(default_factory=list)
    """Handed out by the scheduler, not yet to the rank."""
    judged: bool = False
    """Refused by the scheduler (lost, evicted): no longer beaten for."""
    step_times: tuple[int, int] | None = None
    """Its compute time per step since the last node beat: median (µs) and count."""


class NodeBeats:
    """The ranks of one node, keyed by their connection, and the beats they make. ``interval``: seconds
    between two node beats when nothing else is due, each up to a ``jitter`` share of it shorter so
    that nodes beating together after a new generation drift apart."""

    def __init__(self, heartbeat_timeout: float, interval: float, jitter: float = 0.0) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        self.interval = interval
        self._jitter = jitter
        self._spacing = interval
        self.ranks: dict[int, RankBeat] = {}
        self.news = 0
        """Moves whenever an answer brings a rank something new (a generation, a fault
        time, an injection, a refusal): a rank that sees it move beats at once."""
        self.beaten_at = -math.inf
        """When (monotonic) the last beat went out."""
        self.facts: int | None = None
        """The ``facts`` count of the scheduler's latest reply (None: none said); a large job's
        supervisor asks for its status only when it moves."""

    # ----------------------------------------------------------------- local reports
    def heard(self, key: int, op: str, message: dict[str, Any], now: float) -> bool:
        """Rank ``key`` reported: a registration (``op`` ``register``) or a heartbeat.
        Returns whether the node's beat is due at once (a registration, a change of
        readiness, an urgent step-time summary)."""
        identity = {name: message.get(name) for name in _IDENTITY}
        rank = self.ranks.get(key)
        if rank is None or rank.fields != identity:
            rank = self.ranks[key] = RankBeat(identity, now)
        rank.heard_at = now
        ready = message.get("ready")
        if ready is not None and ready != rank.ready:
            rank.ready, rank.urgent = ready, True
        if op == "register":
            rank.registering = rank.urgent = True
            rank.whole = message.get("whole") is True
        else:
            rank.step, rank.phase = message.get("step"), message.get("phase")
            step_us, steps = message.get("step_us"), message.get("steps")
            if type(step_us) is int and type(steps) is int:
                if message.get("urgent") is True:  # alone, and at once
                    rank.step_times, rank.urgent = (step_us, steps), True
                else:
                    rank.step_times = merge_summaries(rank.step_times, (step_us, steps))
        return rank.urgent

    def forget(self, key: int) -> None:
        """Rank ``key``'s connection closed: its process ended (its supervisor reports
        the exit), so it is beaten for no more."""
        self.ranks.pop(key, None)

    def answer(self, key: int) -> dict[str, Any] | None:
        """What rank ``key``'s local heartbeat is answered: the scheduler's latest
        answer about it, with the injections not yet handed to it (once); ``None``
        before the scheduler said anything about it."""
        rank = self.ranks.get(key)
        if rank is None or rank.answer is None:
            return None
        answer = dict(rank.answer)
        if rank.injections:
            answer["inject"], rank.injections = rank.injections, []
        return answer

    # ----------------------------------------------------------------- node beats
    def next_due(self) -> float:
        """When (monotonic) the next beat is due: at once for a registration, when a
        rank's silence passes the heartbeat timeout (to be judged), else an interval
        after the last beat."""
        due = self.beaten_at + self._spacing
        for rank in self.ranks.values():
            if rank.urgent:
                return -math.inf
            if not rank.judged and rank.answer is not None:
                due = min(due, rank.heard_at + self.heartbeat_timeout + _PAST_TIMEOUT)
        return due

    def beats(self, now: float) -> list[list[tuple[int, dict[str, Any]]]]:
        """The node's beat, in requests of at most :data:`NODE_BEAT_RANKS` ranks and
        about :data:`BEAT_BYTES`: each rank's key and entry (op, identity, step, phase,
        age in ms). Registrations go out once; a rank the scheduler refused, none."""
        self.beaten_at = now
        self._spacing = self.interval * (1 - self._jitter * random.random())
        batches: list[list[tuple[int, dict[str, Any]]]] = []
        size = BEAT_BYTES
        for key, rank in self.ranks.items():
            if rank.judged or (rank.answer is None and not rank.registering):
                continue
            entry = {"op": "register" if rank.registering else "heartbeat", **rank.fields,
                     "step": rank.step, "phase": rank.phase,
                     "age": max(0, round((now - rank.heard_at) * 1000)),
                     **({} if rank.ready is None else {"ready": rank.ready}),
                     **({"whole": True} if rank.registering and rank.whole else {})}
            if rank.step_times is not None:
                entry["step_us"], entry["steps"] = rank.step_times
                rank.step_times = None
            rank.registering = rank.urgent = False
            length = len(encode(entry))
            if size + length > BEAT_BYTES or len(batches[-1]) >= NODE_BEAT_RANKS:
                batches.append([])
                size = 0
            batches[-1].append((key, entry))
            size += length
        return batches

    def fan_out(self, sent: list[tuple[int, dict[str, Any]]], reply: dict[str, Any]
                ) -> dict[int, dict[str, Any]]:
        """Keep each rank's answer in the reply to ``sent``; return the answers to registrations, by
        key, to send at once. Raises ValueError unless the reply answers every rank."""
        answers = reply.get("ranks")
        if not reply.get("ok") or not isinstance(answers, list) or len(answers) != len(sent) \
                or not all(type(answer) in (dict, int) for answer in answers):
            raise ValueError(f"not an answer to a beat of {len(sent)} rank(s): {reply!r:.200}")
        fault_at = reply.get("fault_at")
        facts = reply.get("facts")
        if type(facts) is int:
            self.facts = facts
        registered = {}
        for (key, entry), answer in zip(sent, answers):
            rank = self.ranks.get(key)
            if rank is None:
                continue  # ended meanwhile
            if type(answer) is int:  # an accepted plain heartbeat, in short: its generation
                answer = {"ok": True, "node_id": entry["node_id"], "rank": entry["rank"],
                          "generation": answer, "fault_at": fault_at}
            injections = answer.pop("inject", [])
            if rank.answer is None or injections or any(
                    rank.answer.get(name) != answer.get(name) for name in _CHANGES):
                self.news += 1
            if answer.get("ok"):
                rank.fields.update(node_id=answer.get("node_id"), rank=answer.get("rank"))
                rank.answer = answer
            elif entry["op"] == "heartbeat":
                rank.answer, rank.judged = answer, True  # lost or evicted: it hears so
            if entry["op"] == "register":
                registered[key] = {**answer, **({"inject": injections} if injections else {})}
            else:
                rank.injections.extend(injections)
        return registered
