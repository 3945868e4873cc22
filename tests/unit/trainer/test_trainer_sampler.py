"""The global-batch sampler: disjoint across ranks, layout-independent, resumable."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.sampler import GlobalBatchSampler, eval_batches


def sampler(*, rank: int = 0, world_size: int = 1, micro: int = 4, accum: int = 1,
            num_chunks: int = 50, seed: int = 7) -> GlobalBatchSampler:  # fmt: skip
    return GlobalBatchSampler(
        num_chunks=num_chunks,
        seed=seed,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        rank=rank,
        world_size=world_size,
    )


def step_sets(world_size: int, micro: int, accum: int, steps: int) -> list[list[int]]:
    """Per step: the sorted chunk indices all ranks and micro-steps took together."""
    ranks = [sampler(rank=r, world_size=world_size, micro=micro, accum=accum)
             for r in range(world_size)]  # fmt: skip
    out = []
    for _ in range(steps):
        taken = [i for s in ranks for mb in s.next_step() for i in mb.tolist()]
        out.append(taken)
    return out


def test_ranks_and_micro_steps_take_disjoint_slices_of_the_global_batch() -> None:
    for taken in step_sets(world_size=2, micro=3, accum=2, steps=4):
        assert len(taken) == 12 and len(set(taken)) == 12  # 50 chunks: no wrap in 4 steps


@pytest.mark.parametrize(("world_size", "micro", "accum"), [(2, 4, 1), (1, 4, 2), (2, 2, 2)])
def test_the_sequences_of_a_step_do_not_depend_on_the_layout(
    world_size: int, micro: int, accum: int
) -> None:
    reference = step_sets(world_size=1, micro=8, accum=1, steps=10)
    layout = step_sets(world_size=world_size, micro=micro, accum=accum, steps=10)
    assert [sorted(s) for s in layout] == [sorted(s) for s in reference]


def test_each_epoch_visits_every_chunk_once_in_a_seeded_order() -> None:
    s = sampler(micro=10, num_chunks=50)
    epoch0 = np.concatenate([s.next_global_batch() for _ in range(5)])
    epoch1 = np.concatenate([s.next_global_batch() for _ in range(5)])
    assert sorted(epoch0) == sorted(epoch1) == list(range(50))
    assert not np.array_equal(epoch0, epoch1)
    assert np.array_equal(epoch0, sampler(micro=10).permutation(0))
    assert not np.array_equal(epoch0, sampler(micro=10, seed=8).permutation(0))


def test_a_step_may_cross_an_epoch_boundary() -> None:
    s = sampler(micro=8, num_chunks=20)
    batches = [s.next_global_batch() for _ in range(5)]  # 40 = two epochs exactly
    flat = np.concatenate(batches)
    assert sorted(flat[:20]) == sorted(flat[20:]) == list(range(20))
    assert s.state_dict() == {"epoch": 2, "offset": 0}


def test_restored_state_continues_the_stream_exactly() -> None:
    first = sampler(rank=1, world_size=2, micro=3, accum=2)
    for _ in range(11):  # past the end of epoch 0 (11 x 12 > 50)
        first.next_step()
    state = first.state_dict()
    assert state["epoch"] == 2
    resumed = sampler(rank=1, world_size=2, micro=3, accum=2)
    resumed.load_state_dict(state)
    for _ in range(5):
        for a, b in zip(first.next_step(), resumed.next_step(), strict=True):
            assert np.array_equal(a, b)


def test_eval_batches_are_disjoint_and_the_same_set_for_any_world_size() -> None:
    one = eval_batches(num_chunks=100, num_batches=3, micro_batch_size=4, rank=0, world_size=1)
    two = [
        eval_batches(num_chunks=100, num_batches=3, micro_batch_size=2, rank=r, world_size=2)
        for r in range(2)
    ]
    flat_two = [i for batches in two for b in batches for i in b.tolist()]
    assert sorted(flat_two) == sorted(i for b in one for i in b.tolist()) == list(range(12))
    assert all(len(b) <= 2 for batches in two for b in batches)
    few = eval_batches(num_chunks=3, num_batches=8, micro_batch_size=4, rank=1, world_size=2)
    assert [b.tolist() for b in few] == [[1]]
