"""A plain PyTorch DDP training script that runs on Torchyard (and anywhere else).

A tiny next-byte model learns from text that ships with Python (the standard library's
sources), so it needs no download. Run it:

    torchrun --nproc-per-node 2 train.py --max-steps 200      # anywhere, CPU (gloo) or CUDA
    torchyard submit --code examples/ddp examples/ddp/spec.yaml --follow

What makes it a good citizen of the platform (`torchyard.train`):
- `ty.report(step, loss=...)`: the job's loss chart;
- `ty.set_max_steps(n)`: the job's progress, and an ETA for the jobs queued behind it;
- `ty.checkpoint_dir(step)` + `ty.completed_checkpoint(path)`: checkpoints the platform knows;
- `ty.latest_checkpoint()`: a retried, resumed or restarted job continues where it was;
- `ty.should_stop()`: a pause or cancel (SIGTERM) saves and returns instead of losing work.
"""

from __future__ import annotations

import argparse
import gc
import os
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchyard.train as ty


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per rank")
    parser.add_argument("--context", type=int, default=32, help="bytes the model sees")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_text(max_bytes: int = 2_000_000) -> torch.Tensor:
    """Bytes of the standard library's Python sources (sorted files, first `max_bytes`)."""
    chunks, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).long()


class ByteModel(nn.Module):
    """Predicts the next byte from the `context` bytes before it: embed, flatten, an MLP."""

    def __init__(self, context: int, dim: int = 32, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.mlp = nn.Sequential(
            nn.Linear(context * dim, hidden), nn.GELU(), nn.Linear(hidden, 256)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, context) -> (batch, 256)
        return self.mlp(self.embed(x).flatten(1))


def batch(text: torch.Tensor, step: int, args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """This rank's batch of step `step`: the same on a resumed run as on an uninterrupted one."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + dist.get_rank())
    starts = torch.randint(0, len(text) - args.context - 1, (args.batch_size,), generator=generator)
    windows = torch.stack([text[s : s + args.context + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, -1]


def save(step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Rank 0 writes the checkpoint; every rank then declares it complete (a barrier)."""
    path = ty.checkpoint_dir(step)
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, path / "state.pt")
    ty.completed_checkpoint(path)


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # `python train.py` alone: one process
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    text = load_text()
    model = ByteModel(args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    latest = ty.latest_checkpoint()
    if latest is not None:  # resume: a retry, a resumed pause, a restart after a lost worker
        state = torch.load(latest / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        ty.log_event(f"resumed from step {step}", checkpoint=str(latest))
    ddp_model = DistributedDataParallel(model)
    ty.set_max_steps(args.max_steps)

    while step < args.max_steps:
        step += 1
        inputs, targets = (t.to(device) for t in batch(text, step, args))
        loss = nn.functional.cross_entropy(ddp_model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # the global batch's loss, for the chart
        ty.report(step, loss=mean_loss.item() / dist.get_world_size(), lr=args.lr)
        if step % 10 == 0 and dist.get_rank() == 0:
            print(f"step {step} loss {mean_loss.item() / dist.get_world_size():.4f}", flush=True)
        stop = ty.should_stop()  # every rank, every step: they agree
        if stop or step % args.checkpoint_every == 0 or step == args.max_steps:
            save(step, model, optimizer)
        if stop:
            break

    # gloo may abort at exit while it still holds tensors: let go of them, then shut down.
    del ddp_model, model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
