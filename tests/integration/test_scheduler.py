"""The scheduler with real processes started by hand (msrun's style): a scheduler and 2-3
workers of tests/bin/sched_train.py, faults by real signals, checks through events.jsonl.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from launcher.cli.status import format_status, query
from recovery import env as names
from recovery.control.client import ExitReport
from recovery.control.rpc import REQUESTS, open_client
from recovery.runtime.heartbeat import EXIT_EVICTED
from support import events, run, scheduler_stalled, signed_request, tftctl_cmd, wait_for, wait_for_event
from support.sched_cluster import TOKEN, Cluster, event_fields, exited, log_text

pytestmark = pytest.mark.timeout(90)


def test_workers_register_with_their_ranks_train_and_finish_with_the_scheduler(
        tmp_path: Path, free_port: int) -> None:
    with Cluster(tmp_path, free_port, worker_num=2) as c:
        workers = [c.worker("1")]  # workers first, as msrun's run.sh does
        scheduler = c.scheduler()
        wait_for_event(c.log_dir, 60, "node 1", event="register", node_id="1")
        # Started after the named one: it must not take a rank that one wants.
        workers.append(c.worker(None))
        wait_for_event(c.log_dir, 60, "generation 0", event="generation", generation=0)
        assert sorted(event_fields(events(c.log_dir, "register"), "node_id", "rank")) == [
            ("0", 0), ("1", 1)]  # the worker without a node id got the free rank
        wait_for(lambda: "rank 0 of 2 in generation 0" in log_text(workers[1]), 30,
                 "the worker without a node id training as rank 0")

        table = format_status(query(c.log_dir))  # what tftctl status prints
        assert "generation 0, 2/2 workers live" in table
        assert sum(" alive " in line for line in table.splitlines()) == 2

        workers[0].send_signal(signal.SIGUSR2)
        assert [exited(w, 30) for w in workers] == [0, 0]
        assert exited(scheduler, 30) == 0
        assert sorted(event_fields(events(c.log_dir, "leave"), "node_id", "state", "by")) == [
            ("0", "finished", "worker"), ("1", "finished", "worker")]
        assert events(c.log_dir, "scheduler_stop")[-1]["reason"] == "all 2 workers finished"

        gone = run(tftctl_cmd("status", "--log_dir", str(c.log_dir)), timeout=60)
        assert gone.returncode == 1 and "no job is running in" in gone.stderr


def test_bad_claims_are_refused_and_the_cooldown_refuses_a_dead_node_then_accepts_it(
        tmp_path: Path, free_port: int) -> None:
    with Cluster(tmp_path, free_port, worker_num=2, cooldown=2.0) as c:
        c.scheduler()
        first = [c.worker("0"), c.worker("1")]
        wait_for_event(c.log_dir, 60, "generation 0", event="generation", generation=0)
        incarnations = {e["node_id"]: e["incarnation"] for e in events(c.log_dir, "register")}
        # Relaunched by hand too early: refused while the first ones live, and retrying;
        # beside them, two claims refused for good.
        again = [c.worker("0", "--steps", "5"), c.worker("1", "--steps", "5")]
        wrong_token = c.worker("0", **{names.TFT_JOB_TOKEN: "not-this-job"})
        beyond = c.worker("7")
        assert exited(wrong_token, 60) != 0 and exited(beyond, 60) != 0
        assert "registration refused (token): wrong job token" in log_text(wrong_token)
        assert "rank 7 is beyond worker_num=2 (ranks are 0..1)" in log_text(beyond)
        for proc in again:
            wait_for_event(c.log_dir, 60, f"pid {proc.pid} refused", event="refuse",
                           pid=proc.pid, reason="duplicate")
        assert {(e["pid"], e["reason"]) for e in events(c.log_dir, "refuse")} == {
            (beyond.pid, "rank_out_of_range"), (again[0].pid, "duplicate"),
            (again[1].pid, "duplicate")}
        # The wrong token's requests were refused unread, before any rule.
        assert events(c.log_dir, "request_refused")[0]["reason"] == "signature"
        # What the supervisor does under restart-all: node 1 died, node 0 was stopped.
        for proc in first:
            proc.kill()
            proc.wait()
        c.control.report(ExitReport("1", 1, first[1].pid, incarnations["1"], abnormal=True,
                                    reason="SIGKILL"))
        c.control.report(ExitReport("0", 0, first[0].pid, incarnations["0"], abnormal=False,
                                    reason="stopped"))
        cooldown = wait_for_event(c.log_dir, 30, "cooldown of node 1", event="cooldown",
                                  node_id="1")
        assert cooldown["until"] == pytest.approx(cooldown["ts"] + 2.0, abs=0.05)

        accepted = wait_for_event(c.log_dir, 60, "node 1 back", event="register",
                                  node_id="1", pid=again[1].pid)
        [refusal] = [e for e in events(c.log_dir, "refuse")
                     if e["pid"] == again[1].pid and e["reason"] == "cooldown"]
        assert refusal["ts"] < cooldown["until"] <= accepted["ts"]
        # ``left`` is reckoned as the request is handled, and the event stamped once the
        # batch is saved (a CI run under load: 0.115 s later): never less than it says.
        late = refusal["left"] - (cooldown["until"] - refusal["ts"])
        assert 0 <= late < 0.5, late
        assert "may register again in" in refusal["message"]
        assert not [e for e in events(c.log_dir, "refuse")
                    if e["pid"] == again[0].pid and e["reason"] == "cooldown"]
        wait_for_event(c.log_dir, 60, "generation 1", event="generation", generation=1)
        assert [exited(w, 60) for w in again] == [0, 0]


def _verdicts(c: Cluster) -> dict[int, str]:
    """The scheduler's verdicts so far: rank -> ``heartbeat`` | ``progress``."""
    return {e["rank"]: e["verdict"] for e in events(c.log_dir, "verdict")}


def test_a_frozen_worker_is_declared_dead_a_stalled_one_hung_and_the_dead_one_fenced(
        tmp_path: Path, free_port: int) -> None:
    with Cluster(tmp_path, free_port, worker_num=2, heartbeat_timeout=3.0,
                 progress_timeout=1.5) as c:
        c.scheduler()
        workers = [c.worker("0"), c.worker("1")]
        c.wait_all_past(2, 60)

        workers[1].send_signal(signal.SIGUSR1)  # stalls; its heartbeat goes on
        wait_for(lambda: _verdicts(c) == {1: "progress"}, 30, "a progress verdict")
        workers[0].send_signal(signal.SIGSTOP)  # frozen; no heartbeat
        wait_for(lambda: _verdicts(c) == {0: "heartbeat", 1: "progress"}, 30,
                 "a heartbeat verdict")
        verdicts = {e["rank"]: e for e in events(c.log_dir, "verdict")}
        assert verdicts[1]["verdict"] == "progress" and verdicts[1]["stalled_s"] >= 1.5
        assert verdicts[1]["others_step"] > (verdicts[1]["step"] or 0)
        assert verdicts[0]["verdict"] == "heartbeat" and verdicts[0]["silent_s"] >= 3.0
        wait_for_event(c.log_dir, 10, "node 0's cooldown", event="cooldown", node_id="0")

        workers[0].send_signal(signal.SIGCONT)  # wakes up declared dead: it must leave
        assert exited(workers[0], 30) == EXIT_EVICTED
        assert "evicted by the scheduler" in log_text(workers[0])


def test_an_incomplete_cluster_is_an_error_in_every_log_and_a_nonzero_exit(
        tmp_path: Path, free_port: int) -> None:
    """The scheduler's time-out (1.5 s) runs from the first registration, the worker's (5 s)
    from its start: the worker starts once the scheduler serves, so that its own time-out
    never ends first, however slow the scheduler is to start."""
    with Cluster(tmp_path, free_port, worker_num=2, cluster_time_out=1.5) as c:
        scheduler = c.scheduler()
        wait_for(lambda: "serving the cluster store" in log_text(scheduler), 60, "the scheduler serving")
        worker = c.worker("0", **{names.TFT_CLUSTER_TIME_OUT: "5"})
        assert exited(scheduler, 60) == 1
        assert exited(worker, 60) != 0
        assert ("cluster incomplete after cluster_time_out=1.5s: 1 of 2 workers joined; "
                "missing ranks [1]") in log_text(scheduler)
        assert ("cluster incomplete after cluster_time_out=5s: 1 of 2 workers joined; "
                "missing ranks [1]") in log_text(worker)
        assert events(c.log_dir, "cluster_timeout")[0]["missing"] == [1]


def test_a_worker_whose_generation_was_superseded_in_the_same_batch_joins_the_next(
        tmp_path: Path, free_port: int) -> None:
    """Rank 0's registration forms generation 0, and rank 1's replacement, handled in the
    same batch of requests, forms generation 1 at once: only generation 1 is ever made
    ready. Rank 0 must go on to it, not wait for generation 0 until cluster_time_out (seen
    when node 0 of two came back: its two ranks' registrations formed two generations in
    one batch, and every rank of the job died a minute later)."""
    with Cluster(tmp_path, free_port, worker_num=2, cooldown=0.0, cluster_time_out=30) as c:
        c.scheduler()
        store = wait_for(lambda: _store_client(free_port), 60, "the scheduler's store")
        first_1 = {"node_id": "1", "rank": 1, "pid": os.getpid(), "incarnation": 1}
        with scheduler_stalled(tmp_path / "recovery"):
            # A placeholder rank 1 registers: the scheduler decides, and waits to persist.
            store.queue_push(REQUESTS, signed_request(TOKEN, "register", **first_1))
            wait_for(lambda: store.queue_len(REQUESTS) == 0, 30, "the first request taken")
            rank_0 = c.worker("0", "--steps", "20")
            wait_for(lambda: store.queue_len(REQUESTS) == 1, 60, "rank 0's registration")
            store.queue_push(REQUESTS, signed_request(TOKEN, "leave", **first_1,
                                                      abnormal=False, reason="replaced"))
            rank_1 = c.worker("1", "--steps", "20")
            wait_for(lambda: store.queue_len(REQUESTS) == 3, 60, "rank 1's registration")
        formed = wait_for(lambda: [e["generation"] for e in events(c.log_dir, "generation")
                                   if e["generation"] == 1], 30, "generation 1")
        assert [e["generation"] for e in events(c.log_dir, "generation")] == [0, *formed]
        assert [exited(w, 60) for w in (rank_0, rank_1)] == [0, 0], log_text(rank_0)[-2000:]
        assert "rank 0 of 2 in generation 1" in log_text(rank_0)


def _store_client(port: int) -> object | None:
    try:
        return open_client("127.0.0.1", port, 10.0)
    except Exception:  # not listening yet
        return None
