"""QAT under real `torchrun` (gloo, CPU): ddp and fsdp with 2 ranks train the same
fake-quantized curve as one process, and report the converted model's eval loss next to the
fake-quantized one at the end, with the converted int4 model saved (and, asked by
`checkpoint.export_safetensors`, the final checkpoint consolidated to one safetensors file).

Tolerances: losses 2e-4 relative to the single-process QAT run (observed 4.5e-5 after 4
steps: the fp32 sums run in another order, and an activation or weight that lands within that
difference of a rounding boundary of its int8/int4 grid moves a whole level, so QAT curves
agree less tightly than the plain ones of test_trainer_parallel.py); converted vs
fake-quantized eval loss 1e-4 relative (torchao's converted Linear uses the fake quantizers'
scales and zero points).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from jobspec.job import JobSpec
from tests.support.training import Scenario, read_events, run_plans, statuses, tiny_spec
from tests.support.training import train_losses as losses_of
from trainer.exports.safetensors import load_model_weights

# Every run of the module is one fixture (one process group per world size): its setup may
# take several minutes on a loaded 2-core host, more than the suite's 5-minute default.
pytestmark = pytest.mark.timeout(900)

MAX_STEPS = 4
REL_TOLERANCE = 2e-4
CONVERTED_REL_TOLERANCE = 1e-4


def qat_spec(corpus_dir: Path, nproc: int, strategy: str, mbs: int) -> JobSpec:
    """A global batch of 16 sequences; the same 32 eval chunks for every layout."""
    sections: dict[str, Any] = {
        "parallelism": {"strategy": strategy},
        "resources": {"procs_per_node": nproc},
        "train": {"micro_batch_size": mbs, "max_steps": MAX_STEPS},
        "eval": {"interval_steps": MAX_STEPS, "num_batches": 32 // (mbs * nproc)},
        "checkpoint": {"interval_steps": MAX_STEPS, "export_safetensors": True},
        "sample": {"max_new_tokens": 4},
        "qat": {"group_size": 32},
    }
    return tiny_spec(corpus_dir, **sections)


@pytest.fixture(scope="module")
def runs(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The single-process reference and the 2-rank ddp and fsdp runs, one process group per
    world size (`tests.support.rank_driver`); {name: workdir}."""
    root = tmp_path_factory.mktemp("qat")
    single = [Scenario("single", qat_spec(corpus_dir, 1, "single", 16), root / "single")]
    two = [Scenario(s, qat_spec(corpus_dir, 2, s, 8), root / s) for s in ("ddp", "fsdp")]
    return run_plans([(None, single), (2, two)], root)


@pytest.fixture(scope="module")
def reference(runs: dict[str, Path]) -> list[dict]:
    return read_events(runs["single"] / "run")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_qat_on_two_ranks_follows_the_single_process_curve_and_reports_converted_eval_loss(
    strategy: str, reference: list[dict], runs: dict[str, Path]
) -> None:
    events = read_events(runs[strategy] / "run")
    got, want = losses_of(events), losses_of(reference)
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=REL_TOLERANCE), step

    done, ref = statuses(events)[-1]["data"], statuses(reference)[-1]["data"]
    assert done["eval_loss_qat_fake"] == pytest.approx(done["final_eval_loss"], rel=1e-9)
    assert done["eval_loss_qat_fake"] == pytest.approx(ref["eval_loss_qat_fake"], rel=REL_TOLERANCE)
    assert done["eval_loss_qat_converted"] == pytest.approx(
        done["eval_loss_qat_fake"], rel=CONVERTED_REL_TOLERANCE
    )
    converted = Path(done["qat_converted_uri"])
    assert sorted(p.name for p in converted.iterdir()) == ["config.json", "model.safetensors"]
    # checkpoint.export_safetensors: the final checkpoint, consolidated by the reporting rank.
    exported = safetensors.torch.load_file(done["export_uri"])
    final = load_model_weights(done["checkpoint_uri"])
    assert final and exported.keys() == final.keys()
    assert all(torch.equal(exported[k], final[k]) for k in final)
