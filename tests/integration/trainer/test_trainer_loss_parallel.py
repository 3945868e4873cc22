"""Packed rows and the global-batch loss under real process groups (2 processes, gloo,
`torch.multiprocessing`), against one process taking the same 16 rows in one micro-batch.

The rows pack 2 examples each (positions restart, attention within each) and supervise
unequal lengths, so the ranks' shares hold different numbers of supervised positions: a
per-rank or per-micro-batch mean, or a stage that dropped the segment ids, would not match.
- ddp, 2 x 2 sequences x 4 accumulation steps: the same loss and gradients.
- the same for a Hugging Face Llama (from a config) with LoRA adapters under ddp (packing
  through `position_ids`);
- fsdp (sharded parameters, 2 x 4 sequences x 2 accumulation steps), tensor (heads split
  over the ranks) and pipeline (1F1B, 2 stages, 2 accumulation steps,
  segment ids passed to every stage): the same loss and global gradient norm.

Tolerance as in tests/unit/trainer/test_trainer_loss.py: 16 x 64 token terms summed in another order
in fp32, rtol = 1024 x 2^-23 ~ 1.2e-4, atol 1e-7 for gradient entries near 0.

The two ranks are started once for the module and take every layout's step in turn in the same
gloo group (each layout builds its own run, meshes and groups), so the imports (~3 CPU-s per
process) are paid once instead of once per layout.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.tolerances import ATOL, RTOL
from tests.support.training import (
    FINE_TUNE,
    build_rows_run,
    cpu_world_of_one,
    tiny_spec,
    uneven_rows,
)
from trainer.data.rows import IGNORE_INDEX, Rows
from trainer.distributed import DistInfo, init_distributed
from trainer.loop import Run, agree, train_step
from workers.launcher import free_port

SEQ_LEN, NUM_ROWS, SEED = 64, 48, 3
PIPELINE = {"strategy": "pipeline", "pipeline": {"schedule": "1f1b", "num_microbatches": 2}}
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": SEQ_LEN}  # fmt: skip
# A fine-tune's spec (`FINE_TUNE`); built in process, its base keeps the seeded weights.
HF_LORA = {"model": {"kind": "hf", "hf": {"from_config": LLAMA}, **FINE_TUNE}, "lora": {"r": 4}}
# name: (parallelism, micro_batch_size, grad_accum_steps, other spec sections); 16 rows per
# step in each
LAYOUTS: dict[str, tuple[dict[str, Any], int, int, dict[str, Any]]] = {
    "ddp": ({"strategy": "ddp"}, 2, 4, {}),
    "fsdp": ({"strategy": "fsdp"}, 4, 2, {}),
    "tensor": ({"strategy": "tensor"}, 16, 1, {}),
    "pipeline": (PIPELINE, 8, 2, {}),
    "hf_lora_ddp": ({"strategy": "ddp"}, 4, 2, HF_LORA),
}


def _rows() -> Rows:
    return uneven_rows(NUM_ROWS, SEQ_LEN, seed=SEED, segments=2)


def _rank(rank: int, port: int, corpus_dir: str, out: str) -> None:
    """One rank: one step of every layout in turn, in one process group; rank 0 saves each
    layout's (loss, grad_norm, gradients) as OUT/LAYOUT/result.pt."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        LOCAL_RANK=str(rank), WORLD_SIZE="2",
    )  # fmt: skip
    torch.set_num_threads(1)
    info = init_distributed("cpu")
    for layout in LAYOUTS:
        workdir = Path(out) / layout
        workdir.mkdir(exist_ok=True)
        result = _step(info, layout, Path(corpus_dir), workdir)
        if rank == 0:
            torch.save(result, workdir / "result.pt")
        del result
        # free the run's gloo work before the next layout and before the group goes
        # (docs/ARCHITECTURE.md, 'Torch traps')
        gc.collect()
        dist.barrier()
    dist.destroy_process_group()


def _step(info: DistInfo, layout: str, corpus_dir: Path, out: Path) -> dict[str, Any]:
    parallelism, micro, accum, sections = LAYOUTS[layout]
    spec = tiny_spec(
        corpus_dir,
        parallelism=parallelism,
        resources={"procs_per_node": 2},
        train={"micro_batch_size": micro, "grad_accum_steps": accum},
        **sections,
    )
    whole = parallelism["strategy"] == "ddp"  # whole gradients on every rank
    return one_step(build_rows_run(spec, _rows(), out / "ckpt", info), grads=whole)


def one_step(run: Run, *, grads: bool) -> dict[str, Any]:
    """One `train_step`: the reported (all-reduced) loss, the global gradient norm and, with
    `grads`, the gradients the optimizer stepped with."""
    stepped: list[torch.Tensor] = []
    if grads:
        run.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: stepped.extend(
                p.grad.clone() for p in run.model.parameters() if p.grad is not None
            )
        )
    local_loss, grad_norm, _ = train_step(run)
    loss, _ = agree(run, local_loss)  # all ranks' token sums / N
    return {"loss": loss, "grad_norm": grad_norm, "grads": stepped}


_SINGLE: dict[str, dict[str, Any]] = {}


def single(layout: str, corpus_dir: Path, workdir: Path) -> dict[str, Any]:
    """One process, one micro-batch of the 16 rows, the model of `layout` (cached per model)."""
    sections = LAYOUTS[layout][3]
    key = "hf" if sections else "gpt"
    if key not in _SINGLE:
        spec = tiny_spec(corpus_dir, train={"micro_batch_size": 16}, **sections)
        run = build_rows_run(spec, _rows(), workdir, cpu_world_of_one())
        first = run.sampler.permutation(0)[:16]
        labels = [np.asarray(run.train_rows.labels[first[r * 8 : (r + 1) * 8]]) for r in (0, 1)]
        counts = [int((half != IGNORE_INDEX).sum()) for half in labels]
        assert counts[0] != counts[1]  # the two halves of the batch supervise unequal counts
        _SINGLE[key] = one_step(run, grads=True)
    return _SINGLE[key]


@pytest.fixture(scope="module")
def two_rank_results(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory where the two ranks left every layout's result (one spawn per module)."""
    out = tmp_path_factory.mktemp("loss_parallel")
    mp.start_processes(
        _rank, args=(free_port(), str(corpus_dir), str(out)), nprocs=2, start_method="spawn"
    )
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_processes_take_the_step_of_one_on_packed_rows_of_unequal_lengths(
    layout: str, corpus_dir: Path, tmp_path: Path, two_rank_results: Path
) -> None:
    got = torch.load(two_rank_results / layout / "result.pt")
    want = single(layout, corpus_dir, tmp_path / "single")
    assert got["loss"] == pytest.approx(want["loss"], rel=RTOL)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=RTOL)
    for g_ddp, g_single in zip(got["grads"], want["grads"], strict=len(got["grads"]) > 0):
        torch.testing.assert_close(g_ddp, g_single, rtol=RTOL, atol=ATOL)
