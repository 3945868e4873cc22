"""fsdp, tensor, pipeline and 2-D training under real `torchrun` (gloo, CPU) against one
single-process reference: same seed, same global batch of 16 sequences per step.

Each method runs once crashing after step 4 (a checkpoint at step 3) and once more resumed
from that checkpoint: the first attempt's losses prove equivalence, the second's prove resume.
The runs of one world size share one process group (`tests.support.rank_driver`; the crash is
its `SimulatedCrash`). A 2-rank fsdp checkpoint then loads under `single`
and under `tensor` (DCP resharding by parameter name) and gives the same eval loss.

Tolerance: the methods compute the same fp32 mathematics but sum in other orders (FSDP's
reduce-scatter, TP's partial matmuls and all-reduce, pipeline micro-batches summed one by one):
(n - 1) eps relative for a mean of n per-token losses (tests/support/tolerances.py), n = 16 x 64 for
a step's loss (1.2e-4) and 64 x 64 for the eval loss (4.9e-4). Observed: ~1e-7 relative after 6
steps; a wrong batch or a lost gradient moves the loss by 1e-2 relative or more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobspec.job import JobSpec
from tests.support.tolerances import reordered_sum_rel, tokens_per_step
from tests.support.training import (
    Scenario,
    crash_and_resume,
    read_events,
    run_plans,
    statuses,
    tiny_spec,
)
from tests.support.training import train_losses as losses_of

# Every run of the module is one fixture (one process group per world size): its setup may
# take several minutes on a loaded 2-core host, more than the suite's 5-minute default.
pytestmark = pytest.mark.timeout(900)

MAX_STEPS = 6
FAIL_AT = 4  # after the checkpoint at step 3
SEQ_LEN = 64  # tiny_spec's
EVAL_CHUNKS = 64  # every method evaluates the same 64 held-out chunks
REL_TOLERANCE = reordered_sum_rel(tokens_per_step(16, SEQ_LEN))
EVAL_REL_TOLERANCE = reordered_sum_rel(tokens_per_step(EVAL_CHUNKS, SEQ_LEN))

METHODS: dict[str, tuple[int, dict[str, Any], int, int]] = {
    # name: (processes, parallelism, micro_batch_size, grad_accum_steps); every method takes
    # a global batch of 16 sequences per step. fsdp and 1f1b also accumulate gradients.
    "fsdp": (2, {"strategy": "fsdp"}, 4, 2),
    "tensor": (2, {"strategy": "tensor"}, 16, 1),
    "pipeline_gpipe": (2, {"strategy": "pipeline", "pipeline": {"schedule": "gpipe"}}, 16, 1),
    "pipeline_1f1b": (
        2,
        {"strategy": "pipeline", "pipeline": {"schedule": "1f1b", "num_microbatches": 2}},
        8,
        2,
    ),
    "pipeline_interleaved": (
        2,
        {
            "strategy": "pipeline",
            "pipeline": {"schedule": "interleaved_1f1b", "stages_per_rank": 2},
        },
        16,
        1,
    ),
    "fsdp_tp_2d": (4, {"strategy": "fsdp", "tensor_parallel_size": 2}, 8, 1),
}


def method_spec(
    corpus_dir: Path, nproc: int, parallelism: dict[str, Any], mbs: int, accum: int = 1
) -> JobSpec:
    """4 blocks (so 4 pipeline stages fit), 6 steps, checkpoints every 3, eval at the end."""
    sections: dict[str, dict[str, Any]] = {
        "model": {"n_layers": 4},
        "parallelism": parallelism,
        "resources": {"procs_per_node": nproc},
        "train": {"micro_batch_size": mbs, "grad_accum_steps": accum, "max_steps": MAX_STEPS},
        "eval": {"interval_steps": MAX_STEPS},
        "checkpoint": {"interval_steps": 3, "keep_last": 2},
        "sample": {"max_new_tokens": 8},
    }
    dp = tiny_spec(corpus_dir, **sections).data_parallel_size
    sections["eval"]["num_batches"] = EVAL_CHUNKS // (mbs * dp)
    return tiny_spec(corpus_dir, **sections)


FSDP_STEP = f"step_{MAX_STEPS:08d}"


@pytest.fixture(scope="module")
def runs(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every run of the module, one process group per world size (`tests.support.rank_driver`):
    each method crashed after step FAIL_AT and resumed, the single-process reference, the fsdp
    checkpoint resharded and used as `init_from` under single and tensor, and a single-process
    fine-tune crashed and resumed; {run: its workdir}."""
    root = tmp_path_factory.mktemp("runs")
    by_size: dict[int, list[Scenario]] = {1: [], 2: [], 4: []}
    for method, (nproc, parallelism, mbs, accum) in METHODS.items():
        spec = method_spec(corpus_dir, nproc, parallelism, mbs, accum)
        by_size[nproc] += crash_and_resume(method, spec, root / method, FAIL_AT)
    fsdp = root / "fsdp"
    source = ("--init-from", str(fsdp / "ckpt" / FSDP_STEP))
    for strategy, nproc in (("tensor", 2), ("single", 1)):
        spec = method_spec(corpus_dir, nproc, {"strategy": strategy}, 16)
        reshard, init = f"reshard_{strategy}", f"init_{strategy}"
        by_size[nproc] += [
            Scenario(reshard, spec, root / reshard, copy_checkpoints_from=fsdp),
            Scenario(init, _fine_tune(_with_steps(spec, 2)), root / init, source),
        ]
    single = method_spec(corpus_dir, 1, {"strategy": "single"}, 16)
    by_size[1].insert(0, Scenario("reference", single, root / "reference"))
    fine_tune = _fine_tune(single)
    by_size[1] += crash_and_resume("fine_tune", fine_tune, root / "fine_tune", FAIL_AT, source)
    # the fsdp checkpoint first: world size 1 reads it
    return run_plans([(2, by_size[2]), (None, by_size[1]), (4, by_size[4])], root)


@pytest.fixture(scope="module")
def reference(runs: dict[str, Path]) -> list[dict]:
    """One process, 16 sequences per micro-batch, uninterrupted: the events."""
    return read_events(runs["reference"] / "run")


@pytest.fixture(scope="module")
def fsdp_checkpoint(runs: dict[str, Path]) -> Path:
    """The 2-rank fsdp run's workdir after it completed (checkpoint at MAX_STEPS)."""
    return runs["fsdp"]


def _assert_close(got: dict[int, float], expected: dict[int, float], steps: list[int]) -> None:
    assert sorted(got) == steps
    for step in steps:
        assert got[step] == pytest.approx(expected[step], rel=REL_TOLERANCE), step


@pytest.mark.parametrize("method", list(METHODS))
def test_method_matches_single_process_and_resumes_after_a_crash_on_the_same_curve(
    method: str, reference: list[dict], runs: dict[str, Path]
) -> None:
    expected = losses_of(reference)
    events = read_events(runs[method] / "run")
    _assert_close(losses_of(events, attempt=0), expected, list(range(1, FAIL_AT + 1)))
    running = [e for e in statuses(events) if e["state"] == "running"]
    assert [e["data"]["start_step"] for e in running] == [0, 3]
    assert running[0]["data"]["num_params"] == statuses(reference)[0]["data"]["num_params"]
    _assert_close(losses_of(events, attempt=1), expected, list(range(4, MAX_STEPS + 1)))
    # The reporting rank (the last stage's under pipeline) records each complete checkpoint.
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [3, MAX_STEPS]
    samples = [e for e in events if e["type"] == "sample"]
    assert len(samples) == (0 if method.startswith("pipeline") else 1)
    final, want = statuses(events)[-1]["data"], statuses(reference)[-1]["data"]
    assert final["final_eval_loss"] == pytest.approx(
        want["final_eval_loss"], rel=EVAL_REL_TOLERANCE
    )


@pytest.mark.parametrize("strategy", ["single", "tensor"], ids=["to_single", "to_tensor"])
def test_fsdp_checkpoint_reshards_to_another_strategy_with_the_same_eval_loss(
    strategy: str, fsdp_checkpoint: Path, runs: dict[str, Path]
) -> None:
    saved = statuses(read_events(fsdp_checkpoint / "run"))[-1]["data"]
    assert saved["checkpoint_uri"].endswith(FSDP_STEP)
    running, completed = statuses(read_events(runs[f"reshard_{strategy}"] / "run"))
    assert running["data"]["start_step"] == MAX_STEPS  # nothing left to train: eval only
    assert completed["data"]["final_eval_loss"] == pytest.approx(
        saved["final_eval_loss"], rel=EVAL_REL_TOLERANCE
    )


def _with_steps(spec: JobSpec, max_steps: int) -> JobSpec:
    """`spec` training `max_steps` steps, evaluating and checkpointing at the last, warming up
    for at most those (a longer warmup is refused)."""
    raw = spec.model_dump(mode="json")
    raw["train"]["max_steps"] = max_steps
    raw["eval"]["interval_steps"] = raw["checkpoint"]["interval_steps"] = max_steps
    raw["optim"]["warmup_steps"] = min(raw["optim"]["warmup_steps"], max_steps)
    return JobSpec.model_validate(raw)


def _fine_tune(spec: JobSpec) -> JobSpec:
    """`spec` as the worker writes a fine-tune's: with a pinned `model.init_from`."""
    raw = spec.model_dump(mode="json")
    raw["model"]["init_from"] = {"job": 1, "checkpoint": 1}
    return JobSpec.model_validate(raw)


def _eval_losses(events: list[dict]) -> dict[int, float]:
    return {
        e["step"]: e["values"]["eval_loss"]
        for e in events
        if e["type"] == "metric" and "eval_loss" in e["values"]
    }


@pytest.mark.parametrize("strategy", ["single", "tensor"], ids=["to_single", "to_tensor"])
def test_a_new_run_initialized_from_an_fsdp_checkpoint_starts_at_its_eval_loss(
    strategy: str, fsdp_checkpoint: Path, runs: dict[str, Path]
) -> None:
    source = str(fsdp_checkpoint / "ckpt" / FSDP_STEP)
    saved = statuses(read_events(fsdp_checkpoint / "run"))[-1]["data"]
    workdir = runs[f"init_{strategy}"]
    spec = JobSpec.load(workdir / "spec.json")
    events = read_events(workdir / "run")
    running, completed = statuses(events)
    assert (running["data"]["start_step"], running["data"]["init_from"]) == (0, source)
    # Step 0: the weights as saved by 2 fsdp ranks, now whole or tensor-sharded.
    assert _eval_losses(events)[0] == pytest.approx(
        saved["final_eval_loss"], rel=EVAL_REL_TOLERANCE
    )
    # Only the weights were taken: a fresh optimizer and schedule (warmup from step 1).
    first_lr = next(e["values"]["lr"] for e in events if e["type"] == "metric" and e["step"] == 1)
    assert first_lr == pytest.approx(spec.optim.lr / spec.optim.warmup_steps)
    assert completed["data"]["steps"] == 2


def test_a_resumed_fine_tune_continues_from_its_own_checkpoint(
    fsdp_checkpoint: Path, runs: dict[str, Path]
) -> None:
    source = str(fsdp_checkpoint / "ckpt" / FSDP_STEP)
    events = read_events(runs["fine_tune"] / "run")
    running = [e["data"] for e in statuses(events) if e["state"] == "running"]
    assert [(r["start_step"], r["init_from"]) for r in running] == [(0, source), (3, None)]
    # Step 4 again from the run's own step-3 checkpoint: the same loss as before the crash.
    first, second = losses_of(events, attempt=0), losses_of(events, attempt=1)
    assert second[FAIL_AT] == pytest.approx(first[FAIL_AT], rel=REL_TOLERANCE)
    assert 0 in _eval_losses([e for e in events if e["attempt"] == 0])
    assert 0 not in _eval_losses([e for e in events if e["attempt"] == 1])
