"""How long a training step is blocked by a DCP save: `dcp.save` vs `dcp.async_save`.

    python -m bench.checkpoint [--mb 300] [--repeats 3]

A model of `--mb` MB of fp32 parameters plus its AdamW state (so ~3x that is saved) is
trained one step, then saved each way into a temporary local directory, the same calls
`trainer/checkpoint/checkpointer.py` makes (`no_dist=True`: one process). `blocking_s` is the
time until the call returns (the step can continue); for async, `complete_s` is until the write
finished.
Then a training step is timed while an async save runs in the background. Prints one JSON.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from bench import smoke
from bench._common import emit, note


def _model(mb: int) -> nn.Module:
    width = 2048
    layers = max(1, round(mb * 1024**2 / 4 / (width * width)))
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> float:
    started = time.perf_counter()
    x = torch.randn(16, 2048)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = smoke.parse(parser, mb=2, repeats=1)
    torch.manual_seed(0)
    model = _model(args.mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _step(model, opt)  # the optimizer state exists from here
    num_params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    step_s = statistics.median(_step(model, opt) for _ in range(3))
    sync_s, async_block_s, async_done_s, step_during_s = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            path = Path(tmp) / f"sync_{i}"
            started = time.perf_counter()
            dcp.save(_state(model, opt), storage_writer=dcp.FileSystemWriter(path), no_dist=True)
            sync_s.append(time.perf_counter() - started)
            note(f"sync save {i}: {sync_s[-1]:.2f} s")
        for i in range(args.repeats):
            path = Path(tmp) / f"async_{i}"
            started = time.perf_counter()
            future = dcp.async_save(
                _state(model, opt), storage_writer=dcp.FileSystemWriter(path), no_dist=True
            )
            if isinstance(future, AsyncSaveResponse):
                future = future.upload_completion
            async_block_s.append(time.perf_counter() - started)
            step_during_s.append(_step(model, opt))  # training goes on while it writes
            future.result()
            async_done_s.append(time.perf_counter() - started)
            note(
                f"async save {i}: blocked {async_block_s[-1]:.2f} s, done {async_done_s[-1]:.2f} s"
            )
    med = statistics.median
    emit(
        {
            "bench": "checkpoint",
            "num_params": num_params,
            "saved_bytes": state_bytes,
            "train_step_s": round(step_s, 4),
            "sync_blocking_s": round(med(sync_s), 3),
            "async_blocking_s": round(med(async_block_s), 3),
            "async_complete_s": round(med(async_done_s), 3),
            "train_step_during_async_write_s": round(med(step_during_s), 4),
            "blocking_ratio_async_over_sync": round(med(async_block_s) / med(sync_s), 3),
            "repeats": args.repeats,
            "torch": torch.__version__,
        }
    )


if __name__ == "__main__":
    main()
