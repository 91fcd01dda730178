"""Exactly-once data and the global batch under any membership (recovery/train/shares.py).

Kill schedules are drawn by Hypothesis: ranks die and come back between steps, and steps
are interrupted (voided) by a death before they commit. The cursor moves only on a
commit, so whatever happens the samples an epoch commits are a permutation of the data
set (``constant``), or each at most once with only the epoch's tail left (``shrink``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.train.sampler import ResumableDistributedSampler
from recovery.train.shares import BatchPolicy, StepPlan, plan_step, steps_left


@dataclass
class Job:
    """The cursor's owner: a job of ``worker_num`` ranks training one epoch."""

    sampler: ResumableDistributedSampler
    worker_num: int
    policy: BatchPolicy
    active: set[int] = field(default_factory=set)
    committed: list[int] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)

    def plan(self) -> StepPlan | None:
        return plan_step(self.sampler.cursor, self.sampler.epoch_micro_batches, self.worker_num,
                         sorted(self.active), self.policy)

    def commit(self, plan: StepPlan) -> None:
        for share in plan.shares.values():
            for number in share:
                self.committed.extend(self.sampler.micro_batch(number).tolist())
        self.plans.append(plan)
        self.sampler.set_cursor(len(self.plans), plan.next_cursor)


actions = st.one_of(
    st.tuples(st.just("kill"), st.integers(0, 7)),
    st.tuples(st.just("heal"), st.integers(0, 7)),
    st.tuples(st.just("interrupt"), st.just(0)),
    st.tuples(st.just("step"), st.just(0)),
)


def run_epoch(worker_num: int, batch_size: int, steps: int, policy: BatchPolicy,
              schedule: list[tuple[str, int]], seed: int) -> Job:
    """Play ``schedule`` on one epoch, then train the epoch to its end."""
    sampler = ResumableDistributedSampler(worker_num * batch_size * steps, batch_size,
                                          num_replicas=worker_num, rank=0, seed=seed)
    sampler.set_epoch(1)
    job = Job(sampler, worker_num, policy, set(range(worker_num)))
    for action, rank in schedule:
        rank %= worker_num
        if action == "kill" and job.active - {rank}:
            job.active.discard(rank)
        elif action == "heal":
            job.active.add(rank)
        elif action == "interrupt":
            job.plan()  # planned and voided: a death broke its gradient exchange
        elif (plan := job.plan()) is not None:
            job.commit(plan)
    while (plan := job.plan()) is not None:
        job.commit(plan)
    return job


@settings(max_examples=300, deadline=None)
@given(worker_num=st.integers(1, 6), batch_size=st.integers(1, 3), steps=st.integers(1, 4),
       schedule=st.lists(actions, max_size=30), seed=st.integers(0, 2**16))
def test_constant_policy_commits_every_sample_once_at_the_full_global_batch(
        worker_num: int, batch_size: int, steps: int, schedule: list[tuple[str, int]],
        seed: int) -> None:
    job = run_epoch(worker_num, batch_size, steps, BatchPolicy.CONSTANT, schedule, seed)
    assert sorted(job.committed) == list(range(job.sampler.dataset_size))
    assert len(job.plans) == steps
    for plan in job.plans:
        assert plan.divisor == plan.next_cursor - plan.cursor == worker_num
        numbers = sorted(n for share in plan.shares.values() for n in share)
        assert numbers == list(range(plan.cursor, plan.cursor + worker_num))


@settings(max_examples=300, deadline=None)
@given(worker_num=st.integers(1, 6), batch_size=st.integers(1, 3), steps=st.integers(1, 4),
       schedule=st.lists(actions, max_size=30), seed=st.integers(0, 2**16))
def test_shrink_policy_commits_each_sample_at_most_once_and_leaves_only_the_tail(
        worker_num: int, batch_size: int, steps: int, schedule: list[tuple[str, int]],
        seed: int) -> None:
    job = run_epoch(worker_num, batch_size, steps, BatchPolicy.SHRINK, schedule, seed)
    assert len(set(job.committed)) == len(job.committed)
    untrained = job.sampler.dataset_size - len(job.committed)
    assert 0 <= untrained < len(job.active) * batch_size
    for plan in job.plans:
        assert sorted(n for share in plan.shares.values() for n in share) \
            == list(range(plan.cursor, plan.next_cursor))
        assert all(len(share) == 1 for share in plan.shares.values())


@given(worker_num=st.integers(1, 8), active=st.sets(st.integers(0, 7), min_size=1),
       cursor_steps=st.integers(0, 3))
def test_a_live_rank_keeps_its_own_micro_batch_and_the_lost_ones_are_dealt_evenly(
        worker_num: int, active: set[int], cursor_steps: int) -> None:
    live = sorted(r % worker_num for r in active)
    cursor = cursor_steps * worker_num
    plan = plan_step(cursor, 4 * worker_num, worker_num, live)
    assert plan is not None and set(plan.shares) == set(live)
    for rank in live:
        assert cursor + rank in plan.share(rank)
    counts = [len(plan.share(rank)) for rank in set(live)]
    assert max(counts) - min(counts) <= 1


def test_at_full_membership_rank_r_trains_what_the_step_sampler_gives_it() -> None:
    samplers = [ResumableDistributedSampler(37, 3, num_replicas=4, rank=r, seed=5) for r in range(4)]
    for step_in_epoch in range(samplers[0].steps_per_epoch):
        plan = plan_step(step_in_epoch * 4, samplers[0].epoch_micro_batches, 4, range(4))
        assert plan is not None
        for rank, sampler in enumerate(samplers):
            [number] = plan.share(rank)
            expected = list(sampler.batches())[step_in_epoch][1]
            assert torch.equal(sampler.micro_batch(number), expected)


def test_share_weighted_gradients_over_the_micro_batch_count_equal_the_full_batch_gradient() -> None:
    """What the trainer computes at W < N (docs/elastic.md): each live rank's mean
    gradient over its samples, times its micro-batch count, summed, over N."""
    torch.manual_seed(0)
    worker_num, batch_size = 4, 5
    x, y = torch.randn(worker_num * batch_size, 3), torch.randn(worker_num * batch_size)
    weight = torch.randn(3, requires_grad=True)
    sampler = ResumableDistributedSampler(len(x), batch_size, num_replicas=worker_num, rank=0)

    def mean_grad(indices: torch.Tensor) -> torch.Tensor:
        weight.grad = None
        ((x[indices] @ weight - y[indices]) ** 2).mean().backward()
        assert weight.grad is not None
        return weight.grad.clone()

    full = mean_grad(torch.arange(len(x)))
    plan = plan_step(0, sampler.epoch_micro_batches, worker_num, [1, 3])
    assert plan is not None
    summed = sum(len(share) * mean_grad(torch.cat([sampler.micro_batch(n) for n in share]))
                 for share in plan.shares.values())
    assert torch.allclose(summed / plan.divisor, full, atol=1e-6)


def test_the_cursor_travels_with_the_samplers_state_at_the_step_it_was_recorded_at() -> None:
    trained = ResumableDistributedSampler(60, 2, num_replicas=3, rank=1, seed=4)
    trained.set_epoch(2)
    trained.set_cursor(4, 10)  # four steps, some of them shrunk to fewer micro-batches
    resumed = ResumableDistributedSampler(60, 2, num_replicas=3, rank=1, seed=4)
    resumed.load_state_dict({**trained.state_dict(), "epoch": 2, "step_in_epoch": 4})
    assert (resumed.epoch, resumed.cursor) == (2, 10)
    # Under shrink an epoch may have more steps than at full membership: the cursor places it.
    resumed.load_state_dict({**trained.state_dict(), "cursor_step": 12, "cursor": 29,
                             "epoch": 2, "step_in_epoch": 12})
    assert (resumed.cursor, resumed.init_step) == (29, 9) and resumed.steps_per_epoch == 10
    # A state whose cursor was not recorded at the checkpoint's step: the step places it.
    resumed.load_state_dict({**trained.state_dict(), "epoch": 2, "step_in_epoch": 3})
    assert resumed.cursor == 9


@pytest.mark.parametrize(("cursor", "total", "active", "message"), [
    (0, 8, [], "at least one live rank"),
    (0, 8, [4], r"not all in \[0, 4\)"),
    (9, 8, [0], r"cursor 9 is not in \[0, 8\]"),
])
def test_impossible_plans_are_refused(cursor: int, total: int, active: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_step(cursor, total, 4, active)


@settings(max_examples=200, deadline=None)
@given(worker_num=st.integers(1, 8), steps=st.integers(1, 20), data=st.data(),
       policy=st.sampled_from(list(BatchPolicy)))
def test_steps_left_counts_the_steps_the_plans_make(worker_num: int, steps: int,
                                                    data: st.DataObject,
                                                    policy: BatchPolicy) -> None:
    """What the step events' total is counted from: the steps still planned in the epoch
    while the membership holds."""
    epoch = worker_num * steps
    start = cursor = data.draw(st.integers(0, epoch), label="cursor")
    active = data.draw(st.sets(st.integers(0, worker_num - 1), min_size=1), label="active")
    planned = 0
    while (plan := plan_step(cursor, epoch, worker_num, sorted(active), policy)) is not None:
        planned, cursor = planned + 1, plan.next_cursor
    assert steps_left(start, epoch, worker_num, len(active), policy) == planned
