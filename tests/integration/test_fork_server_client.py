"""The supervisor's end of the fork server (launcher/procs/fork_server.py): a server that
ends before it is warm is given up on with the reason, not after a 60 s wait."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from launcher.procs.fork_server import WARM_TIMEOUT, ForkServer
from launcher.procs.process import Child


def test_a_server_that_ends_before_it_is_ready_is_given_up_at_once_with_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """As when ``recovery`` cannot be imported where tftrun runs: the server exits at once."""
    def start(fd: int) -> Child:
        return Child(subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"],
                                      pass_fds=(fd,), start_new_session=True))

    server = ForkServer(start)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert not server.ready()
    assert time.monotonic() - began < WARM_TIMEOUT / 2
    assert "it ended before it was ready (its log, fork_server.log, says why)" in caplog.text
    assert server.close().process.wait(timeout=10) == 1
