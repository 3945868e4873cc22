"""Parallelism in the spec (422-worthy conflicts with their JSON paths), the mesh layout and
the pipeline split, without launching processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.training import build_local_run, tiny_spec
from tests.support.training import validation_spec as _spec
from trainer.loop import train_step
from trainer.parallel import ParallelDims
from trainer.parallel.pipeline import stage_bounds


def _errors(nproc: int, parallelism: dict[str, Any], **sections: dict[str, Any]) -> list:
    with pytest.raises(ValidationError) as exc:
        _spec(nproc, parallelism, **sections)
    return [(tuple(e["loc"]), e["msg"]) for e in exc.value.errors()]


def test_valid_parallel_specs_are_accepted_with_their_data_parallel_size() -> None:
    assert _spec(2, {"strategy": "fsdp"}).data_parallel_size == 2
    assert _spec(2, {"strategy": "tensor"}).data_parallel_size == 1
    two_d = _spec(4, {"strategy": "fsdp", "tensor_parallel_size": 2})
    assert (two_d.data_parallel_size, two_d.global_batch_size) == (2, 32)
    pipeline = _spec(2, {"strategy": "pipeline", "pipeline": {"schedule": "gpipe"}})
    assert (pipeline.data_parallel_size, pipeline.global_batch_size) == (1, 16)


def test_tensor_parallel_size_must_divide_world_heads_and_widths() -> None:
    errors = _errors(4, {"strategy": "fsdp", "tensor_parallel_size": 3})
    assert {loc for loc, _ in errors} == {("parallelism", "tensor_parallel_size")}
    messages = " ".join(msg for _, msg in errors)
    for what in ("world size", "model.n_heads", "model.d_model", "model.d_ff"):
        assert what in messages


def test_tensor_strategy_uses_every_rank_and_needs_two() -> None:
    (loc, _), *_ = _errors(4, {"strategy": "tensor", "tensor_parallel_size": 2})
    assert loc == ("parallelism", "tensor_parallel_size")
    assert _errors(1, {"strategy": "tensor"})[0][0] == ("resources", "procs_per_node")
    fp16 = _errors(2, {"strategy": "tensor"}, train={"precision": "fp16"})
    assert [loc for loc, _ in fp16] == [("train", "precision")]
    assert _errors(2, {"strategy": "ddp", "tensor_parallel_size": 2})[0][0] == (
        "parallelism",
        "tensor_parallel_size",
    )


@pytest.mark.parametrize(
    ("nproc", "pipeline", "train", "path"),
    [
        (2, {"schedule": "interleaved_1f1b", "stages_per_rank": 4}, {}, "stages_per_rank"),
        (2, {"schedule": "interleaved_1f1b", "stages_per_rank": 1}, {}, "stages_per_rank"),
        (2, {"schedule": "1f1b", "stages_per_rank": 2}, {}, "stages_per_rank"),
        (4, {"num_microbatches": 2}, {}, "num_microbatches"),
        (2, {"num_microbatches": 3}, {}, "micro_batch_size"),
        (2, {"split_points": [3, 1]}, {}, "split_points"),
        (2, {}, {"precision": "fp16"}, "precision"),
    ],
    ids=[
        "more_stages_than_layers",
        "interleaved_needs_virtual_stages",
        "one_stage_per_rank_for_1f1b",
        "fewer_microbatches_than_stages",
        "micro_batch_not_divisible",
        "split_points_not_increasing",
        "fp16_not_supported",
    ],
)
def test_pipeline_conflicts_name_the_field_to_change(
    nproc: int, pipeline: dict[str, Any], train: dict[str, Any], path: str
) -> None:
    errors = _errors(nproc, {"strategy": "pipeline", "pipeline": pipeline}, train=train)
    assert path in {loc[-1] for loc, _ in errors}, errors


def test_meshes_put_a_tensor_parallel_group_on_one_batch_share() -> None:
    two_d = ParallelDims.from_spec(_spec(4, {"strategy": "fsdp", "tensor_parallel_size": 2}), 4)
    assert (two_d.dp_shard, two_d.tp, two_d.dp_size) == (2, 2, 2)
    assert [two_d.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert two_d.reporting_rank == 0
    hsdp = ParallelDims.from_spec(
        _spec(2, {"strategy": "fsdp"}, resources={"nodes": 2, "procs_per_node": 2}), 4
    )
    assert (hsdp.dp_replicate, hsdp.dp_shard) == (2, 2)
    pipe = ParallelDims.from_spec(_spec(2, {"strategy": "pipeline"}), 2)
    assert (pipe.pp, pipe.dp_size, pipe.dp_rank(1), pipe.reporting_rank) == (2, 1, 0, 1)


def test_stages_are_balanced_by_block_count_or_cut_at_split_points() -> None:
    assert stage_bounds(5, 2, None) == [range(0, 3), range(3, 5)]
    assert stage_bounds(4, 4, None) == [range(i, i + 1) for i in range(4)]
    assert stage_bounds(6, 3, [1, 5]) == [range(0, 1), range(1, 5), range(5, 6)]


def test_activation_checkpointing_keeps_losses_and_checkpoint_names(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """Recomputing each block in backward changes neither the step nor the saved names
    (DCP's state-dict helpers drop the `_checkpoint_wrapped_module` prefix)."""
    results = []
    for ac in (False, True):
        train = {"max_steps": 2, "activation_checkpointing": ac}
        spec = tiny_spec(corpus_dir, train=train, eval={"interval_steps": 2})
        run = build_local_run(spec, tmp_path / str(ac))
        losses = [float(train_step(run)[0]) for _ in range(2)]
        keys = set(run.checkpointer.states["model_optim"].state_dict()["model"])
        results.append((losses, keys))
    (plain_losses, plain_keys), (ac_losses, ac_keys) = results
    assert ac_losses == pytest.approx(plain_losses, rel=1e-6)
    assert ac_keys == plain_keys and "blocks.0.attn.wq.weight" in ac_keys
