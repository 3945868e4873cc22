"""QAT in the spec (422 paths) and in a world-of-one run: fake-quantized training, the
converted model's eval loss next to the fake-quantized one, and the saved converted model.

Tolerance for converted vs fake-quantized eval loss: 1e-4 relative. torchao's converted
int8-activation x int4-weight Linear rounds exactly as its fake quantizers do (same scales,
same zero points); only the order of the fp32 sums may differ (observed: equal on CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torchao.quantization.qat.linear import FakeQuantizedLinear

from tests.conftest_trainer import (
    build_local_run,
    read_events,
    statuses,
    tiny_spec,
)
from trainer import qat
from trainer.events import EventWriter
from trainer.export import load_model_weights
from trainer.loop import evaluate, train_loop
from trainer.model import GPT, build_model
from trainer.spec import JobSpec

REL_TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread, as the trainer's launcher gives each rank on a shared CPU host (two
    threads on a loaded 2-core machine made this run 20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _spec(nproc: int, parallelism: dict[str, Any], **sections: dict[str, Any]) -> JobSpec:
    raw: dict[str, Any] = {
        "name": "job",
        "data": {"dataset": "ds_1"},
        "model": {"n_layers": 4, "n_heads": 4, "d_model": 64},
        "parallelism": parallelism,
        "resources": {"procs_per_node": nproc},
        "train": {"micro_batch_size": 16},
        "qat": {},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return JobSpec.model_validate(raw)


def _error_locs(nproc: int, parallelism: dict[str, Any], **sections: dict[str, Any]) -> set:
    with pytest.raises(ValidationError) as exc:
        _spec(nproc, parallelism, **sections)
    return {tuple(e["loc"]) for e in exc.value.errors()}


def test_qat_is_accepted_with_single_ddp_and_fsdp() -> None:
    for nproc, strategy in ((1, "single"), (2, "ddp"), (2, "fsdp")):
        spec = _spec(nproc, {"strategy": strategy}, qat={"group_size": 64})
        assert spec.qat is not None and spec.qat.weight_dtype == "int4"


@pytest.mark.parametrize(
    ("nproc", "parallelism"),
    [
        (2, {"strategy": "tensor"}),
        (2, {"strategy": "pipeline", "pipeline": {"num_microbatches": 2}}),
        (4, {"strategy": "fsdp", "tensor_parallel_size": 2}),
    ],
    ids=["tensor", "pipeline", "fsdp_2d"],
)
def test_qat_with_sharded_linears_is_refused_at_the_qat_field(
    nproc: int, parallelism: dict[str, Any]
) -> None:
    assert _error_locs(nproc, parallelism) == {("qat",)}


def test_qat_group_size_must_divide_the_linear_input_widths() -> None:
    # 48 divides neither d_model 64 nor d_ff 256.
    assert _error_locs(1, {"strategy": "single"}, qat={"group_size": 48}) == {("qat", "group_size")}


def test_init_from_needs_a_job_or_a_checkpoint() -> None:
    with pytest.raises(ValidationError) as exc:
        _spec(1, {"strategy": "single"}, model={"init_from": {}})
    assert [tuple(e["loc"]) for e in exc.value.errors()] == [("model", "init_from")]


def _plain_copy(model: GPT, state: dict[str, torch.Tensor]) -> GPT:
    copy = build_model(model.cfg, device=torch.device("cpu"), seed=0)
    copy.load_state_dict(state)
    return copy


def test_qat_trains_fake_quantized_and_reports_the_converted_eval_loss(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        corpus_dir,
        train={"max_steps": 6},
        eval={"interval_steps": 6},
        checkpoint={"interval_steps": 6},
        sample={"max_new_tokens": 4},
        qat={"group_size": 32},
    )
    run = build_local_run(spec, tmp_path / "ckpt", EventWriter(tmp_path / "run"))
    linears = [m for m in run.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, FakeQuantizedLinear) for m in linears)
    train_loop(run)
    run.checkpointer.close()
    events = read_events(tmp_path / "run")
    losses = [
        e["values"]["loss"] for e in events if e["type"] == "metric" and "loss" in e["values"]
    ]
    assert losses[-1] < losses[0] - 0.5  # it trains through the fake quantizers
    done = statuses(events)[-1]["data"]
    fake, converted = done["eval_loss_qat_fake"], done["eval_loss_qat_converted"]
    assert fake == pytest.approx(done["final_eval_loss"], rel=1e-9)  # same weights, same math
    assert converted == pytest.approx(fake, rel=REL_TOLERANCE)
    qat_metrics = [
        e for e in events if e["type"] == "metric" and "eval_loss_qat_fake" in e["values"]
    ]
    assert [(e["step"], e["values"]["eval_loss_qat_converted"]) for e in qat_metrics] == [
        (6, converted)
    ]
    # Fake quantization is really in the forward: the same weights unquantized score otherwise.
    weights = load_model_weights(done["checkpoint_uri"])
    unquantized = evaluate(run, model=_plain_copy(run.model, weights))
    assert abs(unquantized - fake) > 1e-4

    saved = qat.load_converted(done["qat_converted_uri"])
    int4 = saved.blocks["0"].mlp.fc.weight
    assert type(int4).__name__ == "IntxUnpackedToInt8Tensor"
    assert int(int4.qdata.min()) >= -8 and int(int4.qdata.max()) <= 7
    assert evaluate(run, model=saved) == pytest.approx(converted, rel=1e-9)
