"""The fast verdict's rule (recovery/control/peer_reports.py): a survivor's report of a
peer failure judges a node only once that node's tftrun has stopped beating; a node
that beats is never judged on reports, whoever sends them and whatever they name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from recovery.control.peer_reports import (
    NODE_BEAT_EVERY,
    POLL,
    QUIET,
    BeatClock,
    PeerReport,
    PeerReports,
    node_host,
    node_index,
    peer_host,
)

NODES = ("127.0.0.2/0", "127.0.0.3/1", "127.0.0.4/2")
reports = st.lists(st.tuples(st.integers(0, 5), st.sampled_from((*NODES, None)),
                             st.sampled_from((None, "127.0.0.2", "127.0.0.3", "127.0.0.4", "10.0.0.9")),
                             st.floats(0, 5)), max_size=6)


def simulate(beating: dict[str, float | None], sent: list[tuple[int, str | None, str | None, float]],
             until: float) -> dict[str, float]:
    """Each node beats every NODE_BEAT_EVERY s until its stop time (None: never stops, up
    to a late beat of up to a beat interval); the scheduler reads at every POLL. The
    nodes judged, and when."""
    pending = PeerReports()
    clock = BeatClock()
    judged: dict[str, float] = {}
    queued = sorted(sent, key=lambda report: report[3])
    now = 0.0
    while now <= until:
        while queued and queued[0][3] <= now:
            rank, node, peer, at = queued.pop(0)
            pending.add(PeerReport(rank, node, peer, at))
        counts = {node: int(min(now, stop if stop is not None else now) / NODE_BEAT_EVERY)
                  for node, stop in beating.items()}
        clock.read({node: count for node, count in counts.items()
                    if node in pending.suspects(NODES, now)}, now)
        still = {node: since for node in NODES if (since := clock.still_since(node)) is not None}
        if pending.open(now):
            for node in pending.confirmed(NODES, still, now):
                judged.setdefault(node, now)
        now = round(now + POLL, 6)
    return judged


@given(sent=reports, stops=st.lists(st.none() | st.floats(0, 8), min_size=3, max_size=3))
def test_a_node_is_judged_only_once_its_beat_stood_still_past_the_quiet_time(
        sent: list[tuple[int, str | None, str | None, float]], stops: list[float | None]) -> None:
    beating = dict(zip(NODES, stops))
    for node, at in simulate(beating, sent, 12.0).items():
        stop = beating[node]
        assert stop is not None, f"{node} beats and was judged at {at}"
        assert at - stop > QUIET - NODE_BEAT_EVERY, (node, stop, at)


@given(reporter=st.sampled_from(NODES[:2]), stop=st.floats(0, 4), named=st.booleans())
def test_a_node_gone_is_judged_about_a_second_after_a_report_points_at_it(
        reporter: str, stop: float, named: bool) -> None:
    gone = NODES[2]
    beating: dict[str, float | None] = {node: None for node in NODES}
    beating[gone] = stop
    judged = simulate(beating, [(0, reporter, node_host(gone) if named else None, stop + 0.05)], 12.0)
    assert set(judged) == {gone}
    assert judged[gone] - stop <= QUIET + NODE_BEAT_EVERY + 2 * POLL, judged


def test_the_peer_address_is_read_from_gloos_error_and_the_node_from_its_name() -> None:
    error = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
             "[127.0.0.3]:39047: Connection reset by peer")
    assert peer_host(error) == "127.0.0.3"
    assert peer_host("Connection closed by peer") is None
    assert (node_host("127.0.0.3/1"), node_index("127.0.0.3/1"), node_index("h/pid12")) == ("127.0.0.3", 1, None)
