"""The ports tests name are never ones the kernel may give an outgoing connection.

A port drawn from the ephemeral range can be taken, between the draw and the job's bind,
as the local end of some other test's gloo or store connection: the job then fails to
bind and its test waits out its whole time-out (seen in CI: 120 s waiting for a spare).
"""

from __future__ import annotations

from pathlib import Path

from support import free_tcp_port


def _ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_a_free_port_is_outside_the_ephemeral_range_and_is_bindable() -> None:
    ephemeral = _ephemeral_range()
    ports = {free_tcp_port() for _ in range(50)}
    assert not [p for p in ports if p in ephemeral]
    assert len(ports) > 1  # drawn, not one fixed port that a lingering job could hold


def test_two_xdist_workers_draw_from_disjoint_shares(monkeypatch) -> None:
    drawn = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        drawn[worker] = {free_tcp_port() for _ in range(30)}
    assert not drawn["gw0"] & drawn["gw1"]
    assert not drawn["gw1"] & drawn["gw2"]
    assert not drawn["gw0"] & drawn["gw2"]
