"""The scheduler's answer to each request, by op: status, registrations and beats,
injections, last-words claims, node ranks, exits and retirements."""

from __future__ import annotations

import os
from typing import Any

from recovery.control.claims import LastWords
from recovery.control.inject import Injection, InjectionQueue, check, new_id
from recovery.control.members import Accepted, Identity, Refused
from recovery.control.membership import Membership
from recovery.control.node_ranks import Given, NodeRanks
from recovery.control.requests import Request
from recovery.control.rpc import Op
from recovery.control.scheduler_config import SchedulerConfig
from recovery.control.straggler_watch import StragglerWatch

__all__ = ["RequestHandlers"]

_REGISTER = Op.REGISTER.value


class RequestHandlers:
    """The part of :class:`recovery.control.scheduler.Scheduler` that answers each op once its request
    was verified and parsed; the attributes are the scheduler's."""

    config: SchedulerConfig
    membership: Membership
    injections: InjectionQueue
    last_words: LastWords
    node_ranks: NodeRanks
    stragglers: StragglerWatch
    wakeups: int
    ticks: int
    node_beats: int
    _started: float
    _stamp: float | None
    _decided: list[tuple[str, dict[str, Any]]]
    _changed: bool

    def _on_status(self, request: Request) -> dict[str, Any]:
        """The whole table (``tftctl status``), or with ``nproc`` one node's status: its ranks' rows
        from ``first_rank`` (0 when left out) and the job's facts."""
        cfg = self.config
        scope = request.fields
        if scope["nproc"] is not None:
            return {"ok": True, **self.membership.node_status(
                scope["first_rank"] or 0, scope["nproc"], bool(scope["missing"]))}
        return {"ok": True, **self.membership.status(), "run_id": cfg.run_id,
                "pid": os.getpid(), "host": cfg.host, "started": self._started,
                "supervised": cfg.supervised, "stragglers": self.stragglers.to_json(),
                "rejoin_cooldown": cfg.timeouts.rejoin_cooldown,
                "heartbeat_timeout": cfg.timeouts.heartbeat_timeout,
                "progress_timeout": cfg.timeouts.progress_timeout,
                "cluster_time_out": cfg.timeouts.cluster_time_out,
                "loop": {"wakeups": self.wakeups, "ticks": self.ticks,
                         "node_beats": self.node_beats}}

    def _on_register(self, request: Request) -> dict[str, Any]:
        """A registration; the reply hands the new member the injections already queued for its rank,
        since a fast rank could pass the step before its first beat."""
        fields = request.fields
        answer = self.membership.register(Identity.from_json(fields), self.config.token,
                                          fields["ready"] is not False, whole=fields["whole"] is True)
        return self._handing_out_injections(answer)

    def _on_heartbeat(self, request: Request) -> dict[str, Any]:
        """A beat; the reply hands the member the injections queued for its rank."""
        fields = request.fields
        answer = self.membership.heartbeat(Identity.from_json(fields), self.config.token,
                                           fields["step"], fields["phase"], sent=self._stamp,
                                           ready=fields["ready"])
        self.stragglers.heard(fields, fields["host"])
        return self._handing_out_injections(answer)

    def _on_node_beat(self, request: Request) -> dict[str, Any]:
        """One node's beat: its supervisor registers and beats for its ranks at once. The reply holds
        each rank's answer in the request's order, as its own request would have; an accepted plain
        heartbeat's is only its generation (nearly every rank's: a dict less to build). A generation
        formed by an entry reaches the ranks answered before it in the same reply."""
        node, ranks = request.fields["node"], request.fields["ranks"]
        membership, token, stamp = self.membership, self.config.token, self._stamp
        membership.heard_from_node(node, len(ranks))
        self.node_beats += 1
        answers: list[Any] = []
        generation = membership.generation
        hand_out = self._handing_out_injections if self.injections.pending else None
        for entry in ranks:  # the hot path: what does not change is looked up once
            if entry["steps"] is not None:
                self.stragglers.heard(entry, node)
            # Its fields are checked (recovery/control/requests.py): no conversions.
            age = entry["age"] / 1000
            sent = None if stamp is None else stamp - age
            if entry["op"] != _REGISTER and hand_out is None \
                    and (plain := membership.plain_heartbeat(entry, sent, node)) is not None:
                answers.append(plain.generation if plain.rank == entry["rank"]
                               else plain.to_json())
                continue
            identity = Identity(entry["node_id"] or "", entry["pid"], entry["incarnation"],
                                entry["host"] or "", entry["rank"])
            if entry["op"] == _REGISTER:
                answer = membership.register(identity, token, entry["ready"] is not False,
                                             via=node, whole=entry["whole"] is True)
            else:
                answer = membership.heartbeat(identity, token, entry["step"], entry["phase"],
                                              sent=sent, ready=entry["ready"], via=node,
                                              silent=age)
            answers.append(answer.to_json() if hand_out is None else hand_out(answer))
            if membership.generation != generation:
                generation = membership.generation
                self._answer_again(node, ranks, answers)
        return {"ok": True, "ranks": answers, "fault_at": membership.fault_at,
                "facts": membership.facts_version}

    def _answer_again(self, node: str, ranks: list[dict[str, Any]], answers: list[Any]) -> None:
        """The plain heartbeats answered so far, answered again in the generation just formed."""
        stamp = self._stamp
        for index, answer in enumerate(answers):
            if type(answer) is int:
                entry = ranks[index]
                sent = None if stamp is None else stamp - entry["age"] / 1000
                plain = self.membership.plain_heartbeat(entry, sent, node)
                if plain is not None:
                    answers[index] = plain.generation if plain.rank == entry["rank"] else plain.to_json()

    def _handing_out_injections(self, answer: Accepted | Refused) -> dict[str, Any]:
        """``answer`` as a reply, with the injections queued for an accepted rank."""
        reply = answer.to_json()
        if self.injections.pending and isinstance(answer, Accepted) \
                and (taken := self.injections.take(answer.rank)):
            reply["inject"] = [i.to_json() for i in taken]
            self._changed = True  # handed out: persisted before the reply, never again
        return reply

    def _on_inject(self, request: Request) -> dict[str, Any]:
        fields = request.fields
        injection = Injection(new_id(), fields["rank"], fields["fault"], fields["at_step"],
                              fields["factor"])
        problem = check(injection.rank, injection.fault, injection.at_step,
                        self.config.worker_num, injection.factor)
        if problem is not None:
            return {"ok": False, "reason": "bad_injection", "message": problem}
        self.injections.add(injection)
        self._decide("inject", **injection.to_json(), via="scheduler")
        return {"ok": True, "id": injection.id}

    def _on_last_words(self, request: Request) -> dict[str, Any]:
        """A survivor of a fault claims the last-words save (recovery/control/claims.py)."""
        claim = request.fields
        save = self.last_words.claim(claim["generation"], claim["rank"], claim["step"],
                                     claim["consistent"])
        self._decide("last_words_claim", rank=claim["rank"], generation=claim["generation"],
                     step=claim["step"], consistent=claim["consistent"], granted=save,
                     reason=claim["reason"] or "")
        return {"ok": True, "save": save}

    def _on_node_rank(self, request: Request) -> dict[str, Any]:
        """A node started without ``--node_rank`` asks for its rank
        (recovery/control/node_ranks.py); a new one is persisted before the reply."""
        node_id = request.fields["node_id"]
        answer = self.node_ranks.assign(node_id, request.fields["nproc"], self.config.worker_num)
        if not isinstance(answer, Given):
            self._decide("node_rank_refused", node_id=node_id, reason=answer.reason,
                         message=answer.message)
            return {"ok": False, "reason": answer.reason, "message": answer.message}
        self._decide("node_rank", node_id=node_id, rank=answer.rank,
                     returning=answer.returning)
        return {"ok": True, "node_rank": answer.rank}

    def _decide(self, event: str, **fields: Any) -> None:
        """Record a decision of this module's own: persisted, then announced as ``event``."""
        self._decided.append((event, fields))
        self._changed = True

    def _on_exit(self, request: Request, by: str) -> dict[str, Any]:
        ended = request.fields
        node_id, abnormal = ended["node_id"], ended["abnormal"]
        until = self.membership.report_exit(
            node_id, ended["pid"], ended["incarnation"], abnormal, ended["reason"] or "", by,
            finished=by == "worker" and not abnormal)
        return {"ok": True, "until": until, "left": self.membership.cooldown_left(node_id)}

    def _on_retire(self, request: Request) -> dict[str, Any]:
        """A supervisor retired ranks for good (degraded training, docs/elastic.md)."""
        retired = self.membership.retire(request.fields["retired"], request.fields["reason"])
        return {"ok": True, "retired": retired}
