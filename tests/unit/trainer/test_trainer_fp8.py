"""`train.precision: fp8` (issue 50): the spec's refusals at their field, which Linears become
torchao's `Float8Linear`, and a world-of-one run on CPU (torch's own float8 `_scaled_mm`
kernels: the same e4m3/e5m2 formats and scales as on a GPU, at CPU speed).

The loss tolerance against bf16 is the issue's own goal for the GPU (the curve within 1% of
bf16's): e4m3 keeps 3 mantissa bits (a relative rounding of at most 2^-4 per element) where
bf16 keeps 7 (2^-8), and the dynamic scales make the products' errors average out over K terms,
so over 30 steps of the tiny GPT the curves differ by much less than the loss falls. That float8
is in the forward at all is shown without a tolerance: the two runs' losses are not equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from jobspec.job import JobSpec
from tests.support.training import build_local_run, read_events, tiny_spec, validation_spec
from trainer.events import EventWriter
from trainer.loop import train_loop, train_step
from trainer.methods.float8 import apply_float8, converts, fp8_refusal

FP8 = {"precision": "fp8"}


def _error_messages(nproc: int, parallelism: dict[str, Any], **sections: Any) -> dict:
    with pytest.raises(ValidationError) as exc:
        validation_spec(nproc, parallelism, **sections)
    return {tuple(e["loc"]): e["msg"] for e in exc.value.errors()}


def test_fp8_is_accepted_with_single_ddp_and_fsdp_and_both_recipes() -> None:
    for nproc, strategy in ((1, "single"), (2, "ddp"), (2, "fsdp")):
        for recipe in ("tensorwise", "rowwise"):
            spec = validation_spec(
                nproc, {"strategy": strategy}, train={**FP8, "fp8_recipe": recipe}
            )
            assert (spec.train.precision, spec.train.fp8_recipe) == ("fp8", recipe)


@pytest.mark.parametrize(
    ("nproc", "parallelism", "sections", "says"),
    [
        (2, {"strategy": "tensor"}, {}, "not 'tensor'"),
        (2, {"strategy": "pipeline", "pipeline": {"num_microbatches": 2}}, {}, "not 'pipeline'"),
        (4, {"strategy": "fsdp", "tensor_parallel_size": 2}, {}, "tensor_parallel_size > 1"),
        (1, {"strategy": "single"}, {"qat": {}}, "does not combine with qat"),
        (
            1,
            {"strategy": "single"},
            {"lora": {"r": 4}, "model": {"init_from": {"job": 1}}},
            "does not combine with lora",
        ),
    ],
    ids=["tensor", "pipeline", "fsdp_2d", "qat", "lora"],
)
def test_fp8_is_refused_at_train_precision_with_the_reason(
    nproc: int, parallelism: dict[str, Any], sections: dict[str, Any], says: str
) -> None:
    errors = _error_messages(nproc, parallelism, train=FP8, **sections)
    assert list(errors) == [("train", "precision")]
    assert says in errors[("train", "precision")]


def test_an_unknown_recipe_is_refused_at_its_field() -> None:
    errors = _error_messages(1, {"strategy": "single"}, train={**FP8, "fp8_recipe": "blockwise"})
    assert list(errors) == [("train", "fp8_recipe")]


def test_the_head_and_linears_of_odd_widths_stay_as_they_are() -> None:
    model = nn.ModuleDict(
        {"fc": nn.Linear(64, 256), "odd": nn.Linear(64, 100), "lm_head": nn.Linear(64, 512)}
    )
    assert [name for name, m in model.named_children() if converts(m, name)] == ["fc"]
    assert converts(nn.Linear(32, 32), "model.layers.0.mlp.down_proj")
    assert not converts(nn.Linear(32, 32), "model.lm_head")
    assert not converts(nn.LayerNorm(32), "ln")
    assert apply_float8(model, "tensorwise", torch.device("cpu")) == 1
    assert isinstance(model["fc"], Float8Linear)
    assert type(model["odd"]) is nn.Linear and type(model["lm_head"]) is nn.Linear


def test_a_cpu_can_train_in_float8() -> None:
    assert fp8_refusal(torch.device("cpu")) is None


def _losses(run_dir: Path) -> list[float]:
    events = read_events(run_dir)
    return [e["values"]["loss"] for e in events if e["type"] == "metric" and "loss" in e["values"]]


def _run(corpus_dir: Path, workdir: Path, precision: str) -> tuple[list[float], nn.Module]:
    spec = tiny_spec(
        corpus_dir,
        train={"max_steps": 30, "precision": precision},
        eval={"interval_steps": 30},
        checkpoint={"interval_steps": 30},
        sample={"max_new_tokens": 4},
    )
    run = build_local_run(spec, workdir / "ckpt", EventWriter(workdir / "run"))
    train_loop(run)
    run.checkpointer.close()
    return _losses(workdir / "run"), run.model


def test_an_fp8_run_trains_every_block_linear_in_float8_within_1_percent_of_bf16(
    corpus_dir: Path, tmp_path: Path
) -> None:
    fp8, model = _run(corpus_dir, tmp_path / "fp8", "fp8")
    bf16, _ = _run(corpus_dir, tmp_path / "bf16", "bf16")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 6 and all(isinstance(m, Float8Linear) for m in linears)
    assert len(fp8) == len(bf16) == 30
    assert fp8 != bf16  # float8 is in the path
    assert fp8[-1] < fp8[0] - 1.5  # and it trains
    relative = [abs(a - b) / b for a, b in zip(fp8, bf16, strict=True)]
    assert sum(relative) / len(relative) < 0.01, relative
    assert max(relative) < 0.03, relative


def test_an_fp8_run_resumes_to_the_same_losses(corpus_dir: Path, tmp_path: Path) -> None:
    spec = tiny_spec(corpus_dir, train={"micro_batch_size": 4, "max_steps": 10, **FP8})
    first = build_local_run(spec, tmp_path / "ckpt")
    for _ in range(3):
        train_step(first)
        first.state.step += 1
    first.checkpointer.save(3, force=True)
    first.checkpointer.wait()
    expected = [float(train_step(first)[0]) for _ in range(3)]

    torch.manual_seed(999)
    resumed = build_local_run(spec, tmp_path / "ckpt")
    assert resumed.checkpointer.load_latest() == 3
    assert [float(train_step(resumed)[0]) for _ in range(3)] == expected
    # Float8Linear keeps nn.Linear's parameter names: a bf16 run reads the same checkpoint.
    plain = build_local_run(tiny_spec(corpus_dir), tmp_path / "bf16").model
    assert dict(resumed.model.named_parameters()).keys() == dict(plain.named_parameters()).keys()


def test_a_spec_with_fp8_round_trips() -> None:
    spec = validation_spec(1, {"strategy": "single"}, train={**FP8, "fp8_recipe": "rowwise"})
    again = JobSpec.model_validate(spec.model_dump())
    assert (again.train.precision, again.train.fp8_recipe) == ("fp8", "rowwise")
