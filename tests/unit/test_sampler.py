"""ResumableDistributedSampler: order = f(seed, epoch), position = f(step)."""

from __future__ import annotations

import pytest
import torch

from recovery.train.sampler import ResumableDistributedSampler


def test_ranks_split_an_epoch_into_disjoint_equal_shares() -> None:
    shares = [list(ResumableDistributedSampler(103, 5, num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert [len(s) for s in shares] == [30, 30, 30]  # 34 each, whole batches of 5 only
    flat = [i for share in shares for i in share]
    assert len(set(flat)) == len(flat) and set(flat) <= set(range(103))


def test_order_is_a_pure_function_of_seed_and_epoch() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        sampler = ResumableDistributedSampler(64, 4, num_replicas=2, rank=1, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(3, 2) == order(3, 2)
    assert order(3, 2) != order(3, 1)
    assert order(3, 2) != order(4, 2)


def test_init_step_continues_exactly_where_the_epoch_stopped() -> None:
    full = ResumableDistributedSampler(64, 4, num_replicas=2, seed=9)
    full.set_epoch(2)
    all_batches = list(full.batches())
    resumed = ResumableDistributedSampler(64, 4, num_replicas=2, seed=9)
    resumed.set_epoch(2)
    resumed.set_init_step(3)
    tail = list(resumed.batches())
    assert [step for step, _ in tail] == [4, 5, 6, 7, 8]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(all_batches[3:], tail, strict=True))
    assert list(resumed) == torch.cat([b for _, b in all_batches[3:]]).tolist()
    assert len(resumed) == 20


def test_moving_to_another_epoch_starts_it_from_its_first_step() -> None:
    sampler = ResumableDistributedSampler(64, 4, seed=0)
    sampler.set_epoch(5)
    sampler.set_init_step(16)
    assert list(sampler.batches()) == []  # an epoch whose steps are all done yields nothing
    sampler.set_epoch(5)  # the same epoch again (as a loop does on resume) keeps the position
    assert sampler.init_step == 16
    sampler.set_epoch(6)
    assert sampler.init_step == 0 and len(list(sampler.batches())) == 16


def test_without_shuffle_the_dataset_order_is_kept() -> None:
    sampler = ResumableDistributedSampler(10, 2, num_replicas=2, rank=1, shuffle=False)
    assert list(sampler) == [1, 3, 5, 7]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset_size": 10, "batch_size": 2, "num_replicas": 2, "rank": 2}, "rank 2 is not in"),
        ({"dataset_size": 3, "batch_size": 2, "num_replicas": 2}, "do not fill one batch"),
        ({"dataset_size": 10, "batch_size": 0}, "batch_size must be >= 1"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResumableDistributedSampler(**kwargs)


def test_init_step_beyond_the_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"init step 6 is not in \[0, 5\]"):
        ResumableDistributedSampler(10, 2).set_init_step(6)


def test_its_state_dict_with_a_position_continues_exactly_there(caplog: pytest.LogCaptureFixture) -> None:
    full = ResumableDistributedSampler(64, 4, num_replicas=2, seed=9)
    full.set_epoch(3)
    resumed = ResumableDistributedSampler(64, 4, num_replicas=2, seed=9)
    resumed.load_state_dict({**full.state_dict(), "epoch": 3, "step": 5})
    assert resumed.epoch == 3 and list(resumed) == list(full)[5 * 4 :]
    assert not caplog.records
    ResumableDistributedSampler(64, 4, num_replicas=2, seed=10).load_state_dict(
        {**full.state_dict(), "epoch": 3, "step": 5})
    assert "will not continue exactly" in caplog.text
