"""The scheduler's side of a reported peer failure: it keeps the reports, reads the beats of the nodes
they point at from its own store, and judges a node found silent at once (the rule:
recovery/control/peer_reports.py)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from recovery.control.liveness import LivenessRules
from recovery.control.nodes import BadValue, beat_key, read_signed
from recovery.control.peer_reports import POLL, BeatClock, PeerReport, PeerReports, node_index, peer_host
from recovery.control.requests import Request
from recovery.control.tcpstore_client import StoreError, TCPStoreClient

__all__ = ["FastVerdicts"]

logger = logging.getLogger(__name__)

_TIMEOUT = 1.0


class FastVerdicts:
    """Judges reported peers; ``key`` is the job's key the nodes sign their beats with, and the verdicts
    go to ``membership``."""

    def __init__(self, key: bytes, membership: LivenessRules) -> None:
        self._key = key
        self._membership = membership
        self._reports = PeerReports()
        self._clock = BeatClock()
        self._client: TCPStoreClient | None = None
        self._due = math.inf

    def report(self, request: Request) -> dict[str, Any]:
        """A ``peer_failed`` request: watched for from now on (nothing is judged on it alone)."""
        fields, now = request.fields, time.monotonic()
        member = next((m for m in self._membership.members.values() if m.rank == fields["rank"]), None)
        self._reports.add(PeerReport(fields["rank"], None if member is None else member.via,
                                     peer_host(fields["cause"] or ""), now))
        self._due = now
        return {"ok": True}

    def check(self, host: str, port: int, now: float) -> None:
        """While a report is open: read the beats of the nodes it points at, and judge those that stood
        still too long."""
        if now < self._due:
            return
        if not self._reports.open(now):
            self._due = math.inf
            self._clock.forget()
            return
        self._due = now + POLL
        membership = self._membership
        nodes = list(membership.nodes)  # the judged too: a report may name one
        self._clock.read(self._beats(self._reports.suspects(nodes, now), host, port), now)
        still = {node: since for node in nodes if (since := self._clock.still_since(node)) is not None}
        if (confirmed := self._reports.confirmed(nodes, still, now)) and \
                (reporter := self._reports.reporter) is not None:
            membership.judge_reported_nodes(confirmed, reporter)

    def next_due(self) -> float:
        return self._due

    def _beats(self, nodes: set[str], host: str, port: int) -> dict[str, int | None]:
        """Each node's beat count as read now; a node whose beat is unset or not the job's is left out,
        so never judged."""
        counts: dict[str, int | None] = {}
        try:
            self._client = self._client or TCPStoreClient(host, port, _TIMEOUT)
            for node in nodes:
                if (index := node_index(node)) is None:
                    continue
                try:
                    text = read_signed(self._client, self._key, beat_key(index))
                except BadValue:
                    continue
                if text is not None and text.isdigit():
                    counts[node] = int(text)
        except StoreError as err:
            logger.warning("reading the nodes' beats: %s", err)
            if self._client is not None:
                self._client.close()
            self._client = None
        return counts
