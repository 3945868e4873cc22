"""QAT in the spec (422 paths) and in a world-of-one run: fake-quantized training, the
converted model's eval loss next to the fake-quantized one, and the saved converted model.

Tolerance for converted vs fake-quantized eval loss (`REL_TOLERANCE`): both paths round the
activations per token to int8 and the weights per group to int4 with the same scales and zero
points, dequantize, and call the same fp32 `F.linear` (torchao 0.18's
`IntxUnpackedToInt8Tensor` linear); a dequantized value may differ by an ulp (eps / 2
relative) where the two compute a scale with other fp32 operations. Through the model's 13
matmuls in sequence (2 blocks x (q/k/v, scores, weights x v, wo, fc, proj) + head) of at most
K = 256 terms (d_ff), that is at most 13 * K * eps / 2 ~= 2e-4 relative (Higham, "Accuracy
and Stability of Numerical Algorithms", section 3.1). Observed: equal on CPU. That fake
quantization is in the forward at all is proven without such a tolerance: see
`_one_hot_departures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torchao.quantization.qat.linear import FakeQuantizedLinear

from jobspec.job import JobSpec
from tests.support.training import (
    build_local_run,
    read_events,
    statuses,
    tiny_spec,
    validation_spec,
)
from trainer.events import EventWriter
from trainer.loop import train_loop
from trainer.methods import qat
from trainer.methods.sft import evaluate

REL_TOLERANCE = 13 * 256 * torch.finfo(torch.float32).eps / 2  # derived in the docstring


def _spec(nproc: int, parallelism: dict[str, Any], **sections: dict[str, Any]) -> JobSpec:
    """`validation_spec` with QAT on (its defaults unless `sections` say otherwise)."""
    return validation_spec(nproc, parallelism, **{"qat": {}, **sections})


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


def _one_hot_departures(
    linear: torch.nn.Linear, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How far a fake-quantized Linear's outputs move from the plain ones on one-hot inputs.

    Returns, per output row and group of `group_size` input channels (shape
    [out_features, in_features // group_size]): the largest |fake - plain| output over the
    group's one-hot inputs, the group's int4 step `s`, and the floating-point slack allowed.

    Derivation (no guessed constant, no dependence on the weights or the machine's kernels):
    - Plain: on the one-hot input e_k a Linear returns W[:, k] + b; the dot product has a
      single non-zero term, so no summation order can change it.
    - Fake: the input is first rounded per token to int8 (asymmetric over [min(0, x), max(x)]
      = [0, 1], step 1/255): 0 stays 0 and 1 becomes 255 * fl(1/255) = 1 within an ulp.
      W is rounded per group to torchao's symmetric int4 grid s * {-8, ..., 7} with
      s = max|W_group| / 7.5. The group's largest-magnitude weight is +-7.5 s, exactly half a
      step from the grid points it can go to (+7 s after clamping, -7 s or -8 s), and no
      weight moves more than half a step. So each group's largest departure is s / 2.
    - Slack: s, W / s (its error scaled by 7.5), the dequantized weight, the dequantized input
      (2 roundings), the product, both bias additions and the difference each round once, by
      eps / 2 of values of at most 8 s + |b|: under 28 eps s + eps |b| in all, bounded here by
      8 eps (8 s + |b|), i.e. ~1e-5 s against the s / 2 claimed.
    """
    eps = torch.finfo(torch.float32).eps
    out_features, in_features = linear.weight.shape
    groups = (out_features, in_features // group_size, group_size)
    with torch.no_grad():
        one_hot = torch.eye(in_features)
        fake = linear(one_hot)  # [in_features (k), out_features]
        plain = torch.nn.functional.linear(one_hot, linear.weight, linear.bias)
        moved = (fake - plain).abs().T.reshape(groups).amax(-1)
        step = linear.weight.reshape(groups).abs().amax(-1) / 7.5
        bias = torch.zeros(out_features) if linear.bias is None else linear.bias.abs()
        slack = 8 * eps * (8 * step + bias[:, None])
    return moved, step, slack


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
    # Fake quantization is really in the forward of every trained Linear.
    for linear in linears:
        moved, step, slack = _one_hot_departures(linear, group_size=32)
        assert bool(((moved - step / 2).abs() <= slack).all()), (moved / step).aminmax()

    saved = qat.load_converted(done["qat_converted_uri"])
    int4 = saved.blocks["0"].mlp.fc.weight
    assert type(int4).__name__ == "IntxUnpackedToInt8Tensor"
    assert int(int4.qdata.min()) >= -8 and int(int4.qdata.max()) <= 7
    assert evaluate(run, model=saved) == pytest.approx(converted, rel=1e-9)
