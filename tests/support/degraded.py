"""Test helpers for training through a fault (docs/elastic.md): the degraded job under
tftrun, and the invariants a run of it must keep whatever its membership did.

The job is the MNIST template for 3 epochs of 12 000 samples on 3 ranks (375 steps of 96
samples at full membership), logging after every committed step a ``committed ...`` line
(``--log_params_hash``), and held 0.2 s after each step it trains degraded
(tests/bin/paced.py ``--while_degraded``): a killed rank heals long before the end
whatever the machine's speed, where a job at full speed could end within the cooldown.

Bitwise equality with a fault-free run cannot hold across a change of W, so what is
checked is what must hold (tests/integration/test_degraded.py,
tests/integration/test_chaos_degraded.py): the ranks that committed a step agree on its
parameters, its shares cover its micro-batches, each epoch's samples are a permutation of
the data set (``constant``) or each trained at most once (``shrink``), every rank ends
equal, and the final loss is within :data:`LOSS_TOLERANCE` of the fault-free run's.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from recovery.ckpt import layout
from recovery.ckpt.restore import load_checkpoint
from recovery.train.sampler import ResumableDistributedSampler
from support import REPO, events, tftrun_cmd
from support.mnist import HIDDEN, NARROW

sys.path.insert(0, str(REPO / "templates" / "mnist"))
from mnist_data import load_dataset  # noqa: E402 - the template's folder is not a package
from train import MEAN, STD, build_model  # noqa: E402

TRAIN = str(REPO / "templates" / "mnist" / "train.py")
PACED = (str(REPO / "tests" / "bin" / "paced.py"), "--while_degraded")
WORKERS, BATCH, SAMPLES, EPOCHS = 3, 32, 12000, 3
STEPS_PER_EPOCH = SAMPLES // WORKERS // BATCH
STEPS = EPOCHS * STEPS_PER_EPOCH
"""The job's steps at full membership (and under ``constant``, whatever the membership)."""
LOSS_TOLERANCE = 1e-4
"""Relative difference of the final loss (over the first 2 000 samples) allowed between
a degraded run and the fault-free one (seen: 7e-8; the sums' order is all that differs)."""
JOB = (*NARROW, "--epochs", str(EPOCHS), "--save_steps", "1000", "--synthetic_size", str(SAMPLES),
       "--batch_size", str(BATCH), "--log_every", "50", "--log_params_hash")
COMMITTED = re.compile(r"committed epoch=(\d+) step=(\d+) generation=(\d+) world=(\d+) "
                       r"cursor=(\d+) micro_batches=([\d,]*) params_sha256=(\w+)")


class Committed(NamedTuple):
    """One ``committed ...`` line of a rank's log: its step, where the cursor went, the
    rank's share of the step's micro-batches and its parameters' hash after it."""

    rank: int
    epoch: int
    step: int
    generation: int
    world: int
    cursor: int
    digest: str
    share: tuple[int, ...]


BySteps = dict[int, dict[int, list[Committed]]]
"""Committed lines by step, then by the generation that committed it."""


def degraded_job(tmp_path: Path, port: int, *options: str, script: tuple[str, ...] = (),
                 job: tuple[str, ...] = (), min_workers: int = 2, cooldown: int = 5) -> list[str]:
    """tftrun running the degraded job, logs in ``tmp_path/logs``, ``--min_worker_num=
    min_workers``, ``--rejoin_cooldown=cooldown`` (short, so that the survivors' paced steps
    do not last long); ``script`` goes before the pacer and the template (a wrapper such as
    tests/bin/gated.py), ``job`` after the template's arguments."""
    return tftrun_cmd(f"--worker_num={WORKERS}", f"--min_worker_num={min_workers}",
                      f"--log_dir={tmp_path / 'logs'}", f"--recovery_path={tmp_path / 'recovery'}",
                      f"--master_port={port}", f"--rejoin_cooldown={cooldown}",
                      "--cluster_time_out=120", *options, *script, *PACED, TRAIN, *JOB, *job)


def committed_lines(log_dir: Path) -> list[Committed]:
    """Every rank's ``committed ...`` lines, from all its logs (a relaunch's included)."""
    found = []
    for path in sorted(log_dir.glob("worker_*.log*")):
        rank = int(re.findall(r"worker_(\d+)", path.name)[0])
        for match in COMMITTED.finditer(path.read_text(errors="ignore")):
            epoch, step, generation, world, cursor, share, digest = match.groups()
            found.append(Committed(rank, int(epoch), int(step), int(generation), int(world),
                                   int(cursor), digest, tuple(int(n) for n in share.split(",") if n)))
    return found


def committed_by_step(*log_dirs: Path) -> BySteps:
    """The committed lines of every log dir (a job's, or each node's of one job)."""
    by_step: BySteps = defaultdict(lambda: defaultdict(list))
    for line in (line for log_dir in log_dirs for line in committed_lines(log_dir)):
        by_step[line.step][line.generation].append(line)
    return by_step


def last_committers(by_step: BySteps, step: int) -> list[Committed]:
    """The members of the generation that committed ``step`` last (a rank that died right
    after completing it committed it alone, and its state died with it)."""
    return by_step[step][max(by_step[step])]


def step_micro_batches(step: int, members: list[Committed], size: int) -> range:
    """The micro-batches step ``step`` trained, checked against what its committers logged.

    A step is committed by the members of its generation that completed its all-reduce:
    all of them, or, when the next membership change came during it, some of them (a
    rank that saw the change first voids the step and takes a committer's state over
    the new group). They agree on the parameters; their shares are distinct parts of the
    step's micro-batches, all of them when every member logged the step.
    """
    world, cursor = members[0].world, members[0].cursor
    ranks = [m.rank for m in members]
    assert 1 <= len(ranks) == len(set(ranks)) <= world, f"step {step}: {ranks}"
    assert len({m.digest for m in members}) == 1, f"step {step}: ranks disagree on the parameters"
    trained = range(cursor - size, cursor)
    shares = sorted(n for m in members for n in m.share)
    assert len(shares) == len(set(shares)) and set(shares) <= set(trained), f"step {step}: {shares}"
    if len(ranks) == world:
        assert shares == list(trained), f"step {step}: {shares}"
    return trained


def trained_per_epoch(by_step: BySteps, policy: str, samples: int = SAMPLES,
                      batch: int = BATCH, workers: int = WORKERS) -> dict[int, list[int]]:
    """Each epoch's samples, step by step as the last committers of each step trained them
    (``constant``: every step trains N micro-batches; ``shrink``: one per live rank); by
    default of this module's job."""
    sampler = ResumableDistributedSampler(samples, batch, num_replicas=workers, rank=0)
    trained: dict[int, list[int]] = defaultdict(list)
    for step in sorted(by_step):
        members = last_committers(by_step, step)
        sampler.set_epoch(members[0].epoch)
        size = workers if policy == "constant" else members[0].world
        for number in step_micro_batches(step, members, size):
            trained[members[0].epoch].extend(sampler.micro_batch(number).tolist())
    return trained


def assert_trained_through(log_dir: Path, policy: str) -> BySteps:
    """The invariants of a run of the degraded job, whatever its membership did: every step
    committed once in order, the ranks that committed a step agree on its parameters and
    its shares cover its micro-batches; per epoch the samples are a permutation of the data
    set (``constant``, with as many steps as a fault-free run) or each trained at most once
    with only the tail left (``shrink``); every rank ends with the same parameters. Returns
    the committed lines by step, for what a test checks beyond."""
    by_step = committed_by_step(log_dir)
    trained = trained_per_epoch(by_step, policy)
    if policy == "constant":
        assert sorted(by_step) == list(range(1, STEPS + 1))
        for epoch in range(1, EPOCHS + 1):
            assert sorted(trained[epoch]) == list(range(SAMPLES)), f"epoch {epoch}"
    else:
        assert sorted(by_step) == list(range(1, len(by_step) + 1))
        for epoch, samples in trained.items():
            assert len(set(samples)) == len(samples), f"epoch {epoch} trained a sample twice"
            assert SAMPLES - len(samples) < WORKERS * BATCH, f"epoch {epoch} left more than its tail"
    ends = {e["rank"]: e["params_sha256"] for e in events(log_dir, "train_end")}
    assert set(ends) == set(range(WORKERS)) and len(set(ends.values())) == 1, ends
    return by_step


def assert_shrink_seen(log_dir: Path, by_step: BySteps) -> None:
    """What ``--batch_policy=shrink`` shows: more, smaller steps than a fault-free run; the
    step events' ``total`` (the live view's bar) never behind the step and, the job whole
    again, its real end on every rank; and their ``batch`` (the samples/s) smaller while
    degraded, a whole number of micro-batches."""
    assert len(by_step) > STEPS
    step_events = events(log_dir, "step")
    behind = [(e["rank"], e["step"], e["total"]) for e in step_events if e["step"] > e["total"]]
    assert not behind, f"step events past their total: {behind[:5]}"
    last = {e["rank"]: e["total"] for e in step_events}
    assert last == dict.fromkeys(range(WORKERS), max(by_step)), last
    batches = {e["batch"] for e in step_events if e["batch"] is not None}
    assert WORKERS * BATCH in batches and len(batches) > 1, batches
    assert batches <= {live * BATCH for live in range(1, WORKERS + 1)}, batches


def degraded_steps(by_step: BySteps) -> list[int]:
    """The steps a generation of fewer than :data:`WORKERS` ranks committed."""
    return [step for step, generations in by_step.items()
            if any(members[0].world < WORKERS for members in generations.values())]


def final_loss(recovery_path: Path) -> float:
    """Rank 0's final model's mean loss over the first 2 000 samples of the data set (a
    run of :data:`STEPS` steps: ``constant``)."""
    def position(path: Path) -> tuple[int, int]:
        epoch, step = re.findall(r"-(\d+)_(\d+)\.ckpt$", path.name)[0]
        return int(epoch), int(step)

    final = max(layout.rank_dir(recovery_path, 0).glob("*.ckpt"), key=position)
    assert position(final) == (EPOCHS, STEPS_PER_EPOCH)
    model = build_model(HIDDEN)
    model.load_state_dict(load_checkpoint(final)["model"])
    images, labels = load_dataset(None, SAMPLES)
    with torch.no_grad():
        inputs = (images[torch.arange(2000)].float() / 255 - MEAN) / STD
        return float(F.cross_entropy(model(inputs), labels[torch.arange(2000)]))


def assert_loss_within_tolerance(recovery_path: Path, reference: float) -> None:
    """The run's final loss is within :data:`LOSS_TOLERANCE` of the fault-free run's."""
    got = final_loss(recovery_path)
    assert abs(got - reference) <= LOSS_TOLERANCE * reference, (got, reference)
