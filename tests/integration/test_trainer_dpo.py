"""DPO under `single`, `ddp` and `fsdp` (2 gloo processes under real `torchrun`), with the
built-in GPT trained in full and with a Hugging Face Llama (from a config) under LoRA, on a
preference set from the standard library (prompt: a function's signature; chosen: its
docstring's first line; rejected: another function's).

Each run (tests/integration/dpo_driver.py) takes 8 pairs per step (single: 1 micro-batch of 8;
ddp/fsdp: 2 ranks x 2 micro-batches of 2) and proves:
- at the start the policy is its reference: eval loss log 2, rewards 0;
- training raises the reward accuracy above 0.5 and the margin above 0 on the pairs;
- the ranks' loss shares returned by `DPOMethod.accumulate` add up to the step's mean loss;
- ddp and fsdp follow the single-process loss curve: the loss is normalised by the pairs of
  the global batch, whatever their split. Tolerance 1e-5 relative: the same fp32 mathematics
  summed in another order (DDP's all-reduce, FSDP's reduce-scatter, per-micro-batch sums),
  as in test_trainer_parallel.py, moves the last bits of a loss of ~0.7.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobspec.job import JobSpec
from tests.conftest_dpo import stdlib_pairs, write_preference_rows
from tests.conftest_trainer import (
    REPO_ROOT,
    RUN_TIMEOUT_S,
    TINY_LLAMA,
    free_port,
    tiny_spec,
    trainer_env,
)

SEQ_LEN = 96
NUM_PAIRS = 16
STEPS = 6
REL_TOLERANCE = 1e-5
LOG_2 = math.log(2)
MODELS: dict[str, dict[str, Any]] = {
    "gpt_full": {"model": {"seq_len": SEQ_LEN}, "optim": {"lr": 3e-3}},
    "llama_lora": {
        "model": {"seq_len": SEQ_LEN, "kind": "hf", "hf": {"from_config": TINY_LLAMA}},
        "lora": {"r": 8},
        "optim": {"lr": 1e-2},
    },
}
LAYOUTS = {"single": (1, 8, 1), "ddp": (2, 2, 2), "fsdp": (2, 2, 2)}  # procs, mbs, accum


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pairs")
    write_preference_rows(directory, stdlib_pairs(NUM_PAIRS, SEQ_LEN + 1), SEQ_LEN)
    return directory


def _spec(model: str, strategy: str) -> JobSpec:
    procs, mbs, accum = LAYOUTS[strategy]
    sections = dict(MODELS[model])
    optim = sections.pop("optim")
    return tiny_spec(
        Path("/unused"),
        **sections,
        method={"kind": "dpo", "dpo": {"beta": 0.1}},
        parallelism={"strategy": strategy},
        resources={"procs_per_node": procs},
        train={"micro_batch_size": mbs, "grad_accum_steps": accum, "max_steps": STEPS},
        optim={**optim, "warmup_steps": 0, "weight_decay": 0.0},
        eval={"interval_steps": STEPS},
    )


def _run(spec: JobSpec, rows_dir: Path, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    spec.dump(workdir / "spec.json")
    args = ["-m", "tests.integration.dpo_driver", "--spec", str(workdir / "spec.json")]
    args += ["--rows", str(rows_dir), "--out", str(workdir / "out.json")]
    procs = spec.resources.procs_per_node
    launcher = [sys.executable]
    if procs > 1:
        launcher += ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node"]
        launcher += [str(procs), "--rdzv-backend", "c10d"]
        launcher += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    proc = subprocess.run(
        [*launcher, *args],
        cwd=REPO_ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads((workdir / "out.json").read_text())


_SINGLE: dict[str, dict[str, Any]] = {}


def _single(model: str, rows_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if model not in _SINGLE:
        workdir = tmp_path_factory.mktemp(f"single_{model}")
        _SINGLE[model] = _run(_spec(model, "single"), rows_dir, workdir)
    return _SINGLE[model]


@pytest.mark.parametrize("strategy", list(LAYOUTS))
@pytest.mark.parametrize("model", list(MODELS))
def test_dpo_raises_reward_accuracy_and_margin_and_matches_single_process(
    model: str,
    strategy: str,
    rows_dir: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    single = _single(model, rows_dir, tmp_path_factory)
    out = single if strategy == "single" else _run(_spec(model, strategy), rows_dir, tmp_path)
    start, end = out["eval_start"], out["eval_end"]
    assert start["eval_loss"] == pytest.approx(LOG_2, rel=1e-6)
    assert start["eval_rewards/margin"] == 0.0 and start["eval_rewards/accuracy"] == 0.0
    assert end["eval_rewards/accuracy"] > 0.5, end
    assert end["eval_rewards/margin"] > 0.0 and end["eval_loss"] < LOG_2, end
    losses = [step["loss"] for step in out["train"]]
    shares = [step["shares_sum"] for step in out["train"]]
    assert shares == pytest.approx(losses, rel=1e-6)  # the step's loss as the loop sees it
    assert losses[0] == pytest.approx(LOG_2, rel=1e-6)  # step 1 scores the initial policy
    expected = [step["loss"] for step in single["train"]]
    assert losses == pytest.approx(expected, rel=REL_TOLERANCE)
