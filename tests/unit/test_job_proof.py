"""A fresh key per launch, and the proof a joining node asks of node 0's scheduler
(recovery/control/job_proof.py, launcher/nodes/job.py), with a real c10d store."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed import HashStore

from launcher.config import LaunchConfig
from launcher.nodes.job import keep_job, served_at
from launcher.nodes.link import save_job, saved_job
from recovery.control.files import StateFile
from recovery.control.job_proof import JobNotice, JobProof, ask_key, parse_proof
from recovery.control.nodes import JobIdentity, job_names, parse_job, stored_at
from recovery.control.signing import (
    BadSignature,
    Kind,
    ReplayGuard,
    job_key,
    new_nonce,
    open_value,
    seal,
    sign_value,
    unseal,
)

TOKEN = "the-secret"
JOB = JobIdentity("run-1", "lineage1", 4, 2, "epoch-of-this-launch")


@given(name=st.sampled_from(["tft/end", "tft/rendezvous/0", "tft/round/0/join/1", "tft/ready/0"]),
       value=st.text(max_size=20))
def test_a_value_of_an_earlier_launch_of_the_job_verifies_in_no_other(name: str, value: str) -> None:
    """Same token, same run id, another epoch: another key, so another name and a MAC
    that does not verify."""
    first, second = job_key(TOKEN, "run-1", "epoch-1"), job_key(TOKEN, "run-1", "epoch-2")
    assert stored_at(first, name) != stored_at(second, name)
    with pytest.raises(BadSignature):
        open_value(second, name, sign_value(first, name, value))
    assert open_value(first, name, sign_value(first, name, value)) == value


def question(token: str, op: str = "job") -> bytes:
    return seal(ask_key(token), Kind.REQUEST, op, "r1", new_nonce(), "{}").encode()


def answered(notice: JobNotice, raw: bytes) -> tuple[str | None, str | None] | None:
    """``notice``'s answer to ``raw`` as the scheduler asks for it: once the job's key refused it."""
    with pytest.raises(BadSignature) as refused:
        unseal(job_key(TOKEN, JOB.run_id, JOB.epoch), Kind.REQUEST, raw)
    return notice.answer(raw, refused.value.header)


def test_a_question_is_answered_once_with_the_job_its_launch_and_where_it_is_served() -> None:
    notice = JobNotice(TOKEN, JOB, ReplayGuard())
    store = HashStore()
    notice.publish(store, "10.0.0.1", 8118)
    for name in job_names(TOKEN):
        assert parse_job(TOKEN, store.get(name)) == JOB  # the epoch in tft/job too
    asked = question(TOKEN)
    rid, reply = answered(notice, asked)
    assert rid == "r1" and reply is not None
    sealed = unseal(ask_key(TOKEN), Kind.REPLY, reply)
    assert sealed.nonce == unseal(ask_key(TOKEN), Kind.REQUEST, asked).nonce
    assert parse_proof(json.loads(sealed.body)) == JobProof(JOB, "10.0.0.1:8118")
    assert answered(notice, asked) == (None, None)  # the same question again: no answer
    assert answered(notice, question("another-secret")) is None  # the usual refusal then
    assert answered(notice, question(TOKEN, op="status")) is None
    assert notice.answer(b"not a message", None) is None


@pytest.mark.parametrize(("address", "served"), [
    ("127.0.0.2:8118", True), ("127.0.0.5:8118", False), ("127.0.0.2:8119", False),
    ("garbage", False)])
def test_a_proof_counts_only_when_signed_for_the_address_the_node_asked(
        address: str, served: bool) -> None:
    """Another job's scheduler, reached by relaying the question, signs its own address."""
    assert served_at(JobProof(JOB, address), "127.0.0.2", 8118) is served


@pytest.mark.parametrize("finished", [False, True])
def test_node_0_keeps_its_launch_epoch_only_for_nodes_that_still_wait_for_it(
        tmp_path: Path, finished: bool) -> None:
    """A node 0 that returns to a running job keeps the epoch its other nodes' workers sign
    with; a job resumed after it ended (``--is_recover=1``) is a new launch: a new epoch."""
    save_job(tmp_path, JOB)
    StateFile(tmp_path).save({"run_id": JOB.run_id, "finished": finished})
    config = LaunchConfig(script=tmp_path / "train.py", worker_num=4, local_worker_num=2,
                          nnodes=2, recovery_path=tmp_path, lineage=JOB.lineage, is_recover=True)
    kept = keep_job(replace(config, epoch="a-new-epoch"))
    assert kept.run_id == JOB.run_id
    assert kept.epoch == ("a-new-epoch" if finished else JOB.epoch)
    assert saved_job(tmp_path) == replace(JOB, epoch=kept.epoch)


def test_every_launch_draws_its_own_epoch(tmp_path: Path) -> None:
    first, second = (LaunchConfig(script=tmp_path / "train.py") for _ in range(2))
    assert len(first.epoch) == 32 and first.epoch != second.epoch
