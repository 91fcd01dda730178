"""The scheduler's membership rules, free of I/O: who may join, with which rank, and when.

Everything here is a function of the requests and of an injected clock, so the rules are tested exactly.
Cooldowns are wall-clock times (unix seconds) because they are persisted across scheduler restarts;
heartbeat and progress ages are monotonic and restart from zero with the scheduler.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from typing import Any

from recovery.control.eviction import StragglerEviction
from recovery.control.job_facts import JobFacts
from recovery.control.liveness import LivenessRules
from recovery.control.members import (
    ALIVE,
    ENDINGS,
    FINISHED,
    LIVE_STATES,
    TRANSITIONS,
    Accepted,
    Clock,
    Identity,
    Member,
    MemberState,
    NodeSeen,
    Refused,
    RefuseReason,
    token_digest,
)
from recovery.control.membership_status import StatusViews
from recovery.control.node_range import MembershipWhy, membership_why
from recovery.timeouts import Timeouts

__all__ = ["Membership", "describe_incomplete", "NO_GENERATION"]

logger = logging.getLogger(__name__)

STATE_VERSION = 1
NO_GENERATION = -1
"""The generation before the first is formed; the first formed is 0."""


class Membership(LivenessRules, StatusViews, StragglerEviction):
    """The cluster's members, cooldowns and generation, and the rules that change them. With
    ``min_worker_num`` below ``worker_num``, a member's death forms a *degraded* generation of the live
    members at once instead of stopping them (docs/elastic.md); the first one waits for all."""

    def __init__(self, worker_num: int, token: str, timeouts: Timeouts,
                 clock: Clock | None = None, min_worker_num: int | None = None) -> None:
        if worker_num < 1:
            raise ValueError(f"worker_num must be at least 1, got {worker_num}")
        min_worker_num = worker_num if min_worker_num is None else min_worker_num
        if not 1 <= min_worker_num <= worker_num:
            raise ValueError(f"min_worker_num must be in [1, {worker_num}], got {min_worker_num}")
        self.worker_num = worker_num
        self.min_worker_num = min_worker_num
        self.token = token
        self.timeouts = timeouts
        self.clock: Clock = time if clock is None else clock
        self.generation = NO_GENERATION
        self.members: dict[str, Member] = {}
        self.nodes: dict[str, NodeSeen] = {}
        """The nodes whose supervisors beat for their ranks, by name."""
        self._rank_holders: dict[int, str] = {}  # rank -> node id; a member's rank never changes
        self.cooldowns: dict[str, float] = {}  # node id -> unix time
        self.retired: set[int] = set()
        """Ranks retired for good (:meth:`retire`): not awaited until they register again."""
        self._facts: JobFacts | None = None
        """The job-wide facts a node's status holds, kept until :meth:`_changed` as they are O(members)
        to find."""
        self.facts_version = secrets.randbits(52)
        """Moves whenever what a node's status holds may change but for steps; every ``node_beat`` reply
        carries it, so a supervisor asks for its status only when it moved. It starts at random, so a
        relaunched scheduler's count never matches the one before."""
        self.fault_at: float | None = None
        """When the newest fault was heard of (unix time); workers get it with every reply."""
        self._formed: frozenset[tuple[str, int]] = frozenset()
        self._incomplete_since: float | None = None  # monotonic
        self._all_finished: tuple[int | None, bool] = (None, False)
        """:attr:`all_finished` as of a :attr:`facts_version`."""
        self._completeness_at: int | None = None
        """:attr:`facts_version` when :meth:`_update_completeness` last ran: the periodic
        rules run it again only after a change (it is O(members))."""
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._last_refusal: dict[str, tuple[int, int, RefuseReason]] = {}
        self._update_completeness()

    # ----------------------------------------------------------------- requests
    def register(self, identity: Identity, token: str, ready: bool = True,
                 via: str | None = None, whole: bool = False) -> Accepted | Refused:
        """A process asks to join, via its node's supervisor ``via`` if not itself (docs/scheduler.md).
        Unless ``ready``, no generation takes it before a heartbeat says it is ready; if ``whole`` (it
        trains in whole generations only), its death starts no cooldown."""
        answer = self._register(identity, token, "register", ready, via)
        if isinstance(answer, Accepted):
            member = self.members[answer.node_id]
            member.via, member.whole = via, whole
        return answer

    def retire(self, ranks: list[int], reason: str) -> list[int]:
        """A supervisor retired ``ranks`` for good: they are not awaited until a process of one
        registers again. A rank held by a live process stays, and nothing is retired before the first
        generation formed; returns the ranks retired now."""
        if self.generation == NO_GENERATION:
            return []  # the first generation waits for every rank
        held = {m.rank for m in self._live()}
        new = sorted({r for r in ranks if 0 <= r < self.worker_num} - held - self.retired)
        if not new:
            return []
        self.retired.update(new)
        self._changed()
        active = [r for r in self.active_ranks() if r not in self.retired]
        self._emit("membership", active=active, world=len(active), generation=self.generation,
                   why=MembershipWhy.SHRINK.value, lost=[], joined=[], retired=new,
                   reason=reason)
        self._update_completeness()
        return new

    def heard_from_node(self, node: str, ranks: int) -> None:
        """``node``'s supervisor beat for ``ranks`` of its ranks: the node is alive."""
        now = self.clock.monotonic()
        seen = self.nodes.setdefault(node, NodeSeen(now))
        seen.heard_at, seen.judged, seen.ranks = now, False, ranks
        seen.beats += 1

    def _register(self, identity: Identity, token: str, event: str,
                  ready: bool = True, via: str | None = None) -> Accepted | Refused:
        if not self.token_ok(token):
            return self._refuse(identity, RefuseReason.TOKEN,
                                "wrong job token: this process belongs to another job")
        node_id = identity.node_id or self._assign_node_id()
        if node_id is None:
            return self._refuse(identity, RefuseReason.FULL,
                                f"all {self.worker_num} ranks are held; none is free for a "
                                "worker without a node id", self.timeouts.heartbeat_interval)
        member = self.members.get(node_id)
        if member is not None and member.state in LIVE_STATES and member.is_process(
                identity.pid, identity.incarnation, identity.host):
            self._confirm(member)  # the same process asking again
            return self._accepted(member)
        rank = self._resolve_rank(node_id, identity)
        if isinstance(rank, Refused):
            return rank
        left = self.cooldown_left(node_id)
        if left > 0:
            return self._refuse(
                identity, RefuseReason.COOLDOWN,
                f"node {node_id} died abnormally; it may register again in {left:.1f}s "
                f"(rejoin_cooldown={self.timeouts.rejoin_cooldown:g}s)", left, left=left)
        if member is not None and member.state in {MemberState.ALIVE, MemberState.HUNG}:
            return self._refuse(
                identity, RefuseReason.DUPLICATE,
                f"node {node_id} is held by a live process (pid {member.pid} on "
                f"{member.host}, incarnation {member.incarnation})",
                self.timeouts.heartbeat_interval)
        return self._admit(node_id, rank, identity, event, ready, via)

    def heartbeat(self, identity: Identity, token: str, global_step: int | None,
                  phase: str | None = None, sent: float | None = None,
                  ready: bool | None = None, via: str | None = None,
                  silent: float = 0.0) -> Accepted | Refused:
        """A registered process is alive and at ``global_step``, doing ``phase`` (if it says).
        ``sent``, the beat's signed stamp, keeps a beat delayed in a flooded queue from making it look
        fresher; ``silent``: seconds since its supervisor ``via`` last heard from it (past the
        heartbeat timeout: lost at once). An unknown process is admitted as if registering, so workers
        re-attach to a scheduler restarted with no persisted state."""
        if not self.token_ok(token):
            return self._refuse(identity, RefuseReason.TOKEN,
                                "wrong job token: this process belongs to another job")
        member = self.members.get(identity.node_id)
        if member is None:
            accepted = self._register(identity, token, "attach", ready is not False)
            if isinstance(accepted, Refused):
                return accepted
            member = self.members[accepted.node_id]
        elif not member.is_process(identity.pid, identity.incarnation, identity.host):
            return self._refuse(identity, RefuseReason.STALE,
                                f"node {identity.node_id} is now held by pid {member.pid} "
                                f"(incarnation {member.incarnation})")
        elif member.state not in LIVE_STATES:
            return self._refuse(identity, RefuseReason.STALE,
                                f"node {identity.node_id} was declared {member.state.value}")
        member.via = via
        if silent > self.timeouts.heartbeat_timeout:
            self._declare_lost(member, silent)
            self._update_completeness()
            return self._refuse(identity, RefuseReason.STALE,
                                f"node {identity.node_id} was silent for {silent:.1f}s")
        self._confirm(member, sent)
        if ready and not member.ready:
            member.ready = True
            self._changed()  # a node's rows show it
            self._update_completeness()
        if self._note(member, global_step, phase) and member.state is MemberState.HUNG:
            logger.info("node %s progresses again (step %d)", member.node_id, global_step)
            self._move(member, MemberState.ALIVE)
        return self._accepted(member)

    def plain_heartbeat(self, beat: dict[str, Any], sent: float | None,
                        via: str) -> Accepted | None:
        """A rank's heartbeat in node ``via``'s beat, decided at once in the plain case as
        :meth:`heartbeat` would: an alive member of this very process, heard within the heartbeat
        timeout, saying nothing new of its readiness. ``None``: anything else, for :meth:`heartbeat`.
        Thousands come a second, nearly all plain."""
        member = self.members.get(beat["node_id"] or "")
        if (member is None or member.state is not ALIVE
                or member.pid != beat["pid"] or member.incarnation != beat["incarnation"]
                or member.host != (beat["host"] or "")
                or beat["age"] > self.timeouts.heartbeat_timeout * 1000
                or (beat["ready"] and not member.ready)):
            return None
        member.via = via
        member.heartbeat_at = max(member.heartbeat_at, self._heard_at(member, sent))
        self._note(member, beat["step"], beat["phase"])
        return self._accepted(member)

    def _note(self, member: Member, global_step: int | None, phase: str | None) -> bool:
        """What a beat says of ``member``'s work; whether its step moved."""
        if phase is not None:
            member.phase = phase
        if global_step is None or global_step == member.global_step:
            return False
        member.global_step = member.generation_step = global_step
        member.progress_at = self.clock.monotonic()
        member.behind_since = None
        return True

    def report_exit(self, node_id: str, pid: int, incarnation: int, abnormal: bool,
                    reason: str, by: str, finished: bool = False) -> float:
        """A process of ``node_id`` ended; return the node's cooldown end (0.0 if none). An
        ``abnormal`` end (crash, signal, kill after a verdict) starts the cooldown; ``by``:
        ``supervisor``, or ``worker`` at exit; ``finished``: its script ran to its end."""
        member = self.members.get(node_id)
        if member is not None and member.state in LIVE_STATES | {MemberState.LOST} \
                and not member.is_process(pid, incarnation):
            logger.warning("ignoring the exit of pid %d (incarnation %d): node %s is held by "
                           "pid %d", pid, incarnation, node_id, member.pid)
            return self.cooldowns.get(node_id, 0.0)
        rank = None if member is None else member.rank
        if abnormal:
            self._start_cooldown(node_id, rank, reason)
        if member is not None and member.is_process(pid, incarnation):
            ending = (MemberState.DEAD if abnormal
                      else MemberState.FINISHED if finished else MemberState.LEFT)
            if member.state is not ending and ending in TRANSITIONS[member.state]:
                self._move(member, ending)
                self._emit("leave", **member.fields(), state=ending.value, reason=reason, by=by,
                           step=member.global_step)
                self._update_completeness()
        return self.cooldowns.get(node_id, 0.0)

    # ----------------------------------------------------------------- queries
    def active_ranks(self) -> list[int]:
        """The ranks of the formed generation, ascending (all of them unless degraded)."""
        return sorted(self.members[node].rank for node, _incarnation in self._formed
                      if node in self.members)

    def cooldown_left(self, node_id: str) -> float:
        return max(0.0, self.cooldowns.get(node_id, 0.0) - self.clock.time())

    @property
    def complete(self) -> bool:
        return len(self._live()) == self.worker_num

    @property
    def all_finished(self) -> bool:
        """Whether every rank's process finished: worked out (O(members)) only after a
        change, since the scheduler asks after every batch that decided something."""
        if self._all_finished[0] != self.facts_version:
            self._all_finished = (self.facts_version,
                                  len(self._finished()) == self.worker_num)
        return self._all_finished[1]

    def drain_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The events decided since the last call, oldest first: ``(name, fields)``."""
        events, self._events = self._events, []
        return events

    # ----------------------------------------------------------------- persistence
    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "worker_num": self.worker_num,
            "token_sha256": token_digest(self.token),
            "generation": self.generation,
            "formed": sorted([node, inc] for node, inc in self._formed),
            "members": [m.to_json() for m in self.members.values()],
            "cooldowns": dict(self.cooldowns),
            "fault_at": self.fault_at,
            "retired": sorted(self.retired),
        }

    def load(self, data: dict[str, Any]) -> str | None:
        """Take over a persisted state; return why it does not fit this job, or ``None``. Live members
        come back UNCONFIRMED with fresh clocks, due within the heartbeat timeout; no generation is
        formed, so the current one's steps still count (time behind counts from now)."""
        if data.get("version") != STATE_VERSION:
            return f"state version {data.get('version')} is not {STATE_VERSION}"
        if data.get("worker_num") != self.worker_num:
            return f"it has worker_num={data.get('worker_num')}, not {self.worker_num}"
        if not hmac.compare_digest(str(data.get("token_sha256")), token_digest(self.token)):
            return "it belongs to a job with another token"
        try:  # all parsed before anything is taken over
            generation = int(data["generation"])
            formed = frozenset((str(node), int(inc)) for node, inc in data["formed"])
            cooldowns = {str(k): float(v) for k, v in data["cooldowns"].items()}
            fault_at = None if data.get("fault_at") is None else float(data["fault_at"])
            members = [Member.from_json(raw) for raw in data["members"]]
            retired = {int(rank) for rank in data.get("retired", [])}
        except (KeyError, TypeError, ValueError) as err:
            return f"it is malformed ({err!r})"
        now = self.clock.monotonic()
        for member in members:
            if member.state in LIVE_STATES:
                member.state = MemberState.UNCONFIRMED
            member.heartbeat_at = member.progress_at = now
        self.generation, self._formed, self.cooldowns = generation, formed, cooldowns
        self.fault_at, self.retired = fault_at, retired
        self.members = {m.node_id: m for m in members}
        self._rank_holders = {m.rank: m.node_id for m in members}
        self._changed()
        self._incomplete_since = None
        self._update_completeness()
        return None

    # ----------------------------------------------------------------- internals
    def token_ok(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token.encode())

    def _move(self, member: Member, to: MemberState) -> None:
        member.transition(to)
        self._changed()

    def _changed(self) -> None:
        """A member's state, a member or the retired ranks changed: the job's facts are
        found again when next asked for."""
        self._facts = None
        self.facts_version += 1

    def _live(self) -> list[Member]:
        return [m for m in self.members.values() if m.state in LIVE_STATES]

    def _finished(self) -> list[Member]:
        return [m for m in self.members.values() if m.state is FINISHED]

    def _emit(self, event: str, **fields: Any) -> None:
        self._events.append((event, fields))

    def _refuse(self, identity: Identity, reason: RefuseReason, message: str,
                retry_after: float | None = None, **extra: Any) -> Refused:
        """Refuse, with one ``refuse`` event per process and reason (not per retry)."""
        key = (identity.pid, identity.incarnation, reason)
        if self._last_refusal.get(identity.node_id) != key:
            self._last_refusal[identity.node_id] = key
            self._emit("refuse", node_id=identity.node_id, rank=identity.rank, pid=identity.pid,
                       incarnation=identity.incarnation, host=identity.host,
                       reason=reason.value, message=message, **extra)
            logger.warning("refused node %r (pid %d): %s", identity.node_id, identity.pid,
                           message)
        return Refused(reason, message, retry_after)

    def _assign_node_id(self) -> str | None:
        """A node id for a worker that has none: a rank nobody holds, else a replaceable one.
        Replaceable: its process ended and its cooldown is over; the newcomer is its relaunch."""
        held = {m.rank for m in self.members.values()}
        for rank in range(self.worker_num):
            if rank not in held and str(rank) not in self.members:
                return str(rank)
        for member in sorted(self.members.values(), key=lambda m: m.rank):
            if member.state in ENDINGS | {MemberState.LOST} \
                    and self.cooldown_left(member.node_id) == 0:
                return member.node_id
        return None

    def _resolve_rank(self, node_id: str, identity: Identity) -> int | Refused:
        """The rank of ``node_id``: kept across relaunches, else asked for, else assigned."""
        known = self.members.get(node_id)
        if known is not None:
            if identity.rank is not None and identity.rank != known.rank:
                return self._refuse(identity, RefuseReason.RANK_MISMATCH,
                                    f"node {node_id} has rank {known.rank}, not {identity.rank}")
            return known.rank
        if identity.rank is not None:
            rank = identity.rank
        elif node_id.isdigit():
            rank = int(node_id)
        else:
            taken = {m.rank for m in self.members.values()}
            free = [r for r in range(self.worker_num) if r not in taken]
            if not free:
                return self._refuse(identity, RefuseReason.FULL,
                                    f"all {self.worker_num} ranks belong to other node ids",
                                    self.timeouts.heartbeat_interval)
            rank = free[0]
        if not 0 <= rank < self.worker_num:
            return self._refuse(identity, RefuseReason.RANK_OUT_OF_RANGE,
                                f"rank {rank} is beyond worker_num={self.worker_num} "
                                f"(ranks are 0..{self.worker_num - 1})")
        holder = self._rank_holders.get(rank)
        if holder is not None:
            return self._refuse(identity, RefuseReason.RANK_TAKEN,
                                f"rank {rank} belongs to node {holder}")
        return rank

    def _admit(self, node_id: str, rank: int, identity: Identity, event: str,
               ready: bool = True, via: str | None = None) -> Accepted:
        now = self.clock.monotonic()
        member = self.members.get(node_id)
        if member is None:
            member = Member(node_id, rank, identity.pid, identity.incarnation, identity.host,
                            MemberState.ALIVE)
            self.members[node_id] = member
            self._rank_holders[rank] = node_id
            self._changed()
        else:
            self._move(member, MemberState.ALIVE)
            member.pid, member.incarnation, member.host = (identity.pid, identity.incarnation,
                                                           identity.host)
            member.global_step = member.phase = member.generation_step = member.behind_since = None
        member.heartbeat_at = member.progress_at = now
        member.least_delay, member.ready = None, ready
        # A retired rank is awaited again, and so are the other retired ranks of its node ``via``, so a
        # returning node's ranks grow the generation together.
        if via is not None and member.rank in self.retired:
            self.retired -= {m.rank for m in self.members.values() if m.via == via}
        self.retired.discard(member.rank)
        member.via = via
        self._changed()  # the retired ranks may have changed since the member's own change
        self._last_refusal.pop(identity.node_id, None)
        self._emit(event, **member.fields(), host=member.host,
                   generation=self._generation_of(member))
        self._update_completeness()
        return self._accepted(member)

    def _confirm(self, member: Member, sent: float | None = None) -> None:
        """A live member was heard from: it is alive (again, after a scheduler restart),
        as of ``sent`` (its request's signed stamp), or now."""
        member.heartbeat_at = max(member.heartbeat_at, self._heard_at(member, sent))
        if member.state is MemberState.UNCONFIRMED:
            self._move(member, MemberState.ALIVE)
            self._emit("attach", **member.fields(), host=member.host,
                       generation=self._generation_of(member))

    def _accepted(self, member: Member) -> Accepted:
        return Accepted(member.node_id, member.rank, self._generation_of(member), self.fault_at)

    def _heard_at(self, member: Member, sent: float | None) -> float:
        """When (monotonic) ``member`` sent a request stamped ``sent`` by its own clock. Host clocks
        differ, so the stamp is read against the member's least delay so far: a first request that
        waited long only makes the member look fresher, never staler, than it is."""
        now = self.clock.monotonic()
        if sent is None:
            return now
        delay = self.clock.time() - sent
        member.least_delay = delay if member.least_delay is None else min(member.least_delay,
                                                                         delay)
        return now - (delay - member.least_delay)

    def _start_cooldown(self, node_id: str, rank: int | None, reason: str) -> None:
        """A fault: the node may not register again for ``rejoin_cooldown`` seconds, unless
        its process trained in whole generations only (its peers wait for its return)."""
        now = self.clock.time()
        self.fault_at = now
        self.facts_version += 1  # a node's rows show it
        if (member := self.members.get(node_id)) is not None and member.whole:
            return
        until = max(self.cooldowns.get(node_id, 0.0), now + self.timeouts.rejoin_cooldown)
        self.cooldowns[node_id] = until
        self._emit("cooldown", node_id=node_id, rank=rank, until=until,
                   seconds=round(until - now, 3), reason=reason)

    def _generation_of(self, member: Member) -> int:
        """The generation ``member`` is in, or the next one, which it will be in."""
        if (member.node_id, member.incarnation) in self._formed:
            return self.generation
        return self.generation + 1

    def _update_completeness(self) -> None:
        """Form a new generation when the cluster is complete with a new set of processes."""
        self._completeness_at = self.facts_version
        if len(self.members) < self.worker_num:  # O(1) while a cluster fills up
            if self._incomplete_since is None:
                self._incomplete_since = self.clock.monotonic()
            return
        live = [m for m in self._live() if m.rank not in self.retired]
        whole = self.worker_num - len(self.retired)  # the job is whole without the retired
        if len(live) + len(self._finished()) < whole:
            if self._incomplete_since is None:
                self._incomplete_since = self.clock.monotonic()
        else:
            self._incomplete_since = None
        live = [m for m in live if m.ready]
        processes = frozenset((m.node_id, m.incarnation) for m in live)
        if len(live) < whole:
            # Degraded: only the survivors of the formed generation; a rank back from a
            # relaunch waits until the job is whole.
            processes &= self._formed
            live = [m for m in live if (m.node_id, m.incarnation) in processes]
        if processes == self._formed or not (
                len(live) == whole >= self.min_worker_num or self._shrinks_to(processes)):
            return
        before = set(self.active_ranks())
        self.generation += 1
        self._formed = processes
        now = self.clock.monotonic()
        for member in live:  # every member's stall clock starts now
            member.progress_at, member.generation_step, member.behind_since = now, None, None
        self._emit("generation", generation=self.generation, world_size=len(live),
                   members=[m.fields() for m in sorted(live, key=lambda m: m.rank)])
        active = self.active_ranks()
        self._emit("membership", active=active, world=len(active), generation=self.generation,
                   why=membership_why(before, active).value, lost=sorted(before - set(active)),
                   joined=sorted(set(active) - before) if before else [])

    def _shrinks_to(self, processes: frozenset[tuple[str, int]]) -> bool:
        """Whether the live ``processes`` form a degraded generation: some members of the
        formed one died or were declared lost (none finished or was stopped), and at
        least ``min_worker_num`` are left."""
        if self.generation == NO_GENERATION or not processes < self._formed \
                or len(processes) < self.min_worker_num:
            return False
        gone = [self.members[node] for node, _incarnation in self._formed - processes]
        return all(member.state in {MemberState.DEAD, MemberState.LOST} for member in gone)


def describe_incomplete(cluster_time_out: float, worker_num: int, missing: list[int]) -> str:
    """The error every process logs when the cluster stays short of workers."""
    return (f"cluster incomplete after cluster_time_out={cluster_time_out:g}s: "
            f"{worker_num - len(missing)} of {worker_num} workers joined; "
            f"missing ranks {missing}")
