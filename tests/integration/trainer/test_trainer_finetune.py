"""LoRA, QLoRA and Hugging Face models under real `torchrun` (gloo, CPU), tiny models.

LoRA adapts trained weights (on a random initialisation it is refused at submission): every
LoRA/QLoRA run of the built-in GPT here fine-tunes the `pre` run's final checkpoint
(`model.init_from`, `--init-from`), and the Hugging Face ones a model saved to a directory.

- LoRA on the built-in GPT under `ddp` and `fsdp` (2 ranks; fsdp also accumulates) against
  one uninterrupted single-process LoRA run with the same seed and global batch (16
  sequences): each crashes after step 4 (checkpoint at step 3) and resumes from the
  adapter-only checkpoint; both attempts' losses must match the reference.
- The reference run's exports: the merged safetensors and the PEFT adapter reloaded on the
  `pre` run's weights give the run's final eval loss, and the same logits.
- QLoRA (NF4, double quant, fp32 compute) single: the eval loss falls below the 4-bit base's
  at step 0, and the merged export (4-bit base dequantized) gives the final eval loss; QLoRA
  under ddp crashes, resumes and matches (its step-0 evaluation first: bitsandbytes' CPU
  inference layout must not stay).
- Hugging Face: a Llama built from a config dict trains in full; a GPT-2 saved to a directory
  with its own tokenizer trains LoRA under fsdp (with activation checkpointing) like
  single-process, and its merged export (`save_pretrained`) gives the final eval loss.
- A LoRA checkpoint saved by 2 fsdp ranks loads in one process (DCP reshards the adapters).

The runs of one world size share one process group (`tests.support.rank_driver`).

Tolerance, as in test_trainer_parallel.py: the same fp32 mathematics summed in other orders
(DDP's all-reduce, FSDP's reduce-scatter, accumulation): (n - 1) eps relative for a mean of n
per-token losses (tests/support/tolerances.py), n = 16 x 64 for a step's loss, 32 x 64 for the eval
loss. Exports are held to the eval bound too: the merged W + (alpha / r) B A is rounded once
more in fp32 (eps / 2 per weight, less than a reordered sum moves a dot product).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from jobspec.job import JobSpec
from tests.support.tolerances import reordered_sum_rel, tokens_per_step
from tests.support.training import (
    TINY_LLAMA,
    Scenario,
    build_local_run,
    cpu_world_of_one,
    crash_and_resume,
    hf_model_with_tokenizer,
    read_events,
    run_plans,
    statuses,
    tiny_spec,
)
from tests.support.training import train_losses as losses_of
from trainer.checkpoint.checkpointer import load_model_only
from trainer.methods.sft import evaluate
from trainer.models.gpt import GPT, GPTConfig, build_model
from trainer.models.hf import HFCausalLM

# Every run of the module is one fixture (one process group per world size): its setup may
# take several minutes on a loaded 2-core host, more than the suite's 5-minute default.
pytestmark = pytest.mark.timeout(900)

MAX_STEPS = 6
FAIL_AT = 4  # after the checkpoint at step 3
SEQ_LEN = 64  # tiny_spec's
EVAL_CHUNKS = 32
REL_TOLERANCE = reordered_sum_rel(tokens_per_step(16, SEQ_LEN))
EVAL_REL_TOLERANCE = reordered_sum_rel(tokens_per_step(EVAL_CHUNKS, SEQ_LEN))
LORA = {"r": 4, "alpha": 8.0}
QLORA = {"compute_dtype": "fp32"}
# name: (processes, parallelism, micro_batch_size, grad_accum_steps): 16 sequences a step
METHODS: dict[str, tuple[int, dict[str, Any], int, int]] = {
    "ddp": (2, {"strategy": "ddp"}, 8, 1),
    "fsdp": (2, {"strategy": "fsdp"}, 4, 2),
}


def ft_spec(
    corpus_dir: Path,
    nproc: int,
    parallelism: dict[str, Any],
    mbs: int = 16,
    accum: int = 1,
    **sections: dict[str, Any],
) -> JobSpec:
    """The tiny GPT (or `model` given), 6 steps, checkpoints every 3, eval at the end; a LoRA
    or QLoRA run of the GPT fine-tunes an earlier job (`FROM_PRE`, run with `INIT`)."""
    if "model" not in sections and (sections.get("lora", LORA) or sections.get("qlora")):
        sections["model"] = FROM_PRE
    sections = {
        "lora": LORA,
        "optim": {"lr": 1e-2},
        "parallelism": parallelism,
        "resources": {"procs_per_node": nproc},
        "train": {"micro_batch_size": mbs, "grad_accum_steps": accum, "max_steps": MAX_STEPS},
        "eval": {"interval_steps": MAX_STEPS},
        "checkpoint": {"interval_steps": 3, "keep_last": 2},
        "sample": {"max_new_tokens": 8},
        **sections,
    }
    dp = 1 if parallelism["strategy"] == "single" else nproc
    sections["eval"] = {**sections["eval"], "num_batches": EVAL_CHUNKS // (mbs * dp)}
    return tiny_spec(corpus_dir, **{k: v for k, v in sections.items() if v is not None})


def _assert_close(got: dict[int, float], expected: dict[int, float], steps: list[int]) -> None:
    assert sorted(got) == steps
    for step in steps:
        assert got[step] == pytest.approx(expected[step], rel=REL_TOLERANCE), step


def _assert_follows(workdir: Path, expected: list[dict]) -> None:
    """Both attempts of the crashed-and-resumed run in `workdir` follow `expected`'s losses."""
    events = read_events(workdir / "run")
    want = losses_of(expected)
    _assert_close(losses_of(events, attempt=0), want, list(range(1, FAIL_AT + 1)))
    _assert_close(losses_of(events, attempt=1), want, list(range(4, MAX_STEPS + 1)))
    running = [e["data"] for e in statuses(events) if e["state"] == "running"]
    assert [d["start_step"] for d in running] == [0, 3]
    assert running[0]["trainable_params"] == statuses(expected)[0]["data"]["trainable_params"]
    final = statuses(events)[-1]["data"]["final_eval_loss"]
    assert final == pytest.approx(
        statuses(expected)[-1]["data"]["final_eval_loss"], rel=EVAL_REL_TOLERANCE
    )


def _exports(events: list[dict]) -> dict[str, Path]:
    return {e["format"]: Path(e["uri"]) for e in events if e["type"] == "export"}


def _final_eval_loss(events: list[dict]) -> float:
    return statuses(events)[-1]["data"]["final_eval_loss"]


def _eval_loss_of(model: torch.nn.Module, spec: JobSpec, scratch: Path) -> float:
    """`model`'s loss on the eval batches a single-process run of `spec` evaluates."""
    run = build_local_run(spec, scratch)
    run.model = model
    return evaluate(run)


GPT2_DIR = "gpt2"
# The GPT LoRA runs' spec and trainer argument: the `pre` run's final checkpoint.
FROM_PRE = {"init_from": {"job": 1}}
PRE_STEP = f"step_{MAX_STEPS:08d}"


def _hf_gpt2(root: Path) -> dict[str, Any]:
    return {"kind": "hf", "hf": {"path_or_id": str(root / GPT2_DIR)}}


@pytest.fixture(scope="module")
def runs(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every trainer run of the module, one process group per world size
    (`tests.support.rank_driver`); {run: its workdir}. A crash and its resume are one run."""
    root = tmp_path_factory.mktemp("runs")
    hf_model_with_tokenizer(corpus_dir, root / GPT2_DIR, model_type="gpt2")
    single = {"strategy": "single"}
    pre = [Scenario("pre", ft_spec(corpus_dir, 1, single, lora=None), root / "pre")]
    init = ("--init-from", str(root / "pre" / "ckpt" / PRE_STEP))
    two: list[Scenario] = []
    for method, (nproc, parallelism, mbs, accum) in METHODS.items():
        spec = ft_spec(corpus_dir, nproc, parallelism, mbs, accum)
        two += crash_and_resume(f"lora_{method}", spec, root / f"lora_{method}", FAIL_AT, init)
    qlora_ddp = ft_spec(corpus_dir, 2, {"strategy": "ddp"}, 8, qlora=QLORA)
    two += crash_and_resume("qlora_ddp", qlora_ddp, root / "qlora_ddp", FAIL_AT, init)
    gpt2_fsdp = ft_spec(corpus_dir, 2, {"strategy": "fsdp"}, 4, 2, model=_hf_gpt2(root))
    gpt2_fsdp.train.activation_checkpointing = True  # checkpoint_wrapper on each GPT2Block
    two.append(Scenario("gpt2_fsdp", gpt2_fsdp, root / "gpt2_fsdp"))
    llama = {"kind": "hf", "hf": {"from_config": TINY_LLAMA}}
    lora = ft_spec(corpus_dir, 1, single)
    one = [
        Scenario("lora_single", lora, root / "lora_single", init),
        Scenario("lora_reshard", lora, root / "lora_reshard", init,
                 copy_checkpoints_from=root / "lora_fsdp", copy_ignore=("lora",)),
        Scenario("qlora_single", ft_spec(corpus_dir, 1, single, qlora=QLORA),
                 root / "qlora_single", init),
        Scenario("llama_full", ft_spec(corpus_dir, 1, single, model=llama, lora=None),
                 root / "llama_full"),
        Scenario("gpt2_single", ft_spec(corpus_dir, 1, single, model=_hf_gpt2(root)),
                 root / "gpt2_single"),
        *crash_and_resume("lora_single_crashed", lora, root / "lora_single_crashed", FAIL_AT,
                          init),
    ]  # fmt: skip
    # `pre` first: every GPT LoRA run adapts its weights; then 2 ranks: the single-process
    # reshard reads the fsdp run's checkpoint
    return run_plans([(None, pre), (2, two), (None, one)], root)


@pytest.mark.parametrize("method", list(METHODS))
def test_lora_matches_single_process_and_resumes_from_an_adapter_checkpoint(
    method: str, runs: dict[str, Path]
) -> None:
    workdir = runs[f"lora_{method}"]
    _assert_follows(workdir, read_events(runs["lora_single"] / "run"))
    assert _exports(read_events(workdir / "run")).keys() == {
        "peft_adapter",
        "merged_safetensors",
    }


def test_lora_fsdp_checkpoint_loads_in_a_single_process_with_the_same_eval_loss(
    runs: dict[str, Path],
) -> None:
    running, completed = statuses(read_events(runs["lora_reshard"] / "run"))
    assert running["data"]["start_step"] == MAX_STEPS  # nothing left to train: eval only
    want = _final_eval_loss(read_events(runs["lora_fsdp"] / "run"))
    assert completed["data"]["final_eval_loss"] == pytest.approx(want, rel=EVAL_REL_TOLERANCE)


def test_lora_run_reports_adapter_counts_and_exports_that_reproduce_the_trained_model(
    runs: dict[str, Path], corpus_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel

    spec = ft_spec(corpus_dir, 1, {"strategy": "single"})
    events = read_events(runs["lora_single"] / "run")
    running = statuses(events)[0]["data"]
    assert 0 < running["trainable_params"] < running["num_params"] / 10
    exports = _exports(events)
    merged_dir, adapter_dir = exports["merged_safetensors"], exports["peft_adapter"]
    assert merged_dir.parent.name == f"step_{MAX_STEPS:08d}"
    assert (adapter_dir / "adapter_config.json").is_file()

    merged = GPT(GPTConfig.from_spec(spec.model))
    merged.load_state_dict(load_file(str(merged_dir / "model.safetensors")))
    adapted = PeftModel.from_pretrained(_pretrained(spec, runs), str(adapter_dir))
    adapted = adapted.base_model.model
    want = _final_eval_loss(events)
    assert _eval_loss_of(merged, spec, tmp_path / "a") == pytest.approx(
        want, rel=EVAL_REL_TOLERANCE
    )
    assert _eval_loss_of(adapted, spec, tmp_path / "b") == pytest.approx(
        want, rel=EVAL_REL_TOLERANCE
    )
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(x), adapted(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(merged(x), _pretrained(spec, runs)(x), atol=1e-3)  # LoRA did


def _pretrained(spec: JobSpec, runs: dict[str, Path]) -> GPT:
    """The `pre` run's trained GPT without adapters (what the LoRA runs started from)."""
    model = build_model(GPTConfig.from_spec(spec.model), device=torch.device("cpu"), seed=spec.seed)
    load_model_only(model, str(runs["pre"] / "ckpt" / PRE_STEP), dist_info=cpu_world_of_one())
    return model


def test_qlora_loss_falls_and_the_dequantized_merged_export_gives_its_eval_loss(
    runs: dict[str, Path], corpus_dir: Path, tmp_path: Path
) -> None:
    events = read_events(runs["qlora_single"] / "run")
    # the adapters learn on top of the 4-bit `pre` model: its eval loss at step 0 falls
    (start,) = [e for e in events if e["type"] == "metric" and e["step"] == 0]
    assert _final_eval_loss(events) < start["values"]["eval_loss"]
    assert statuses(events)[0]["data"]["unigram_eval_loss"] > 0
    spec = ft_spec(corpus_dir, 1, {"strategy": "single"}, qlora=QLORA)
    merged = GPT(GPTConfig.from_spec(spec.model))
    merged_dir = _exports(events)["merged_safetensors"]
    merged.load_state_dict(load_file(str(merged_dir / "model.safetensors")))
    assert _eval_loss_of(merged, spec, tmp_path) == pytest.approx(
        _final_eval_loss(events), rel=EVAL_REL_TOLERANCE
    )


def test_qlora_under_ddp_matches_single_process_and_resumes(runs: dict[str, Path]) -> None:
    _assert_follows(runs["qlora_ddp"], read_events(runs["qlora_single"] / "run"))


def test_hf_llama_from_a_config_trains_in_full(runs: dict[str, Path]) -> None:
    spec = JobSpec.load(runs["llama_full"] / "spec.json")
    assert spec.lora is None and spec.model.kind == "hf"
    events = read_events(runs["llama_full"] / "run")
    running = statuses(events)[0]["data"]
    assert running["trainable_params"] == running["num_params"] > 0
    losses = losses_of(events)
    assert losses[MAX_STEPS] < losses[1] - 0.3, losses
    assert not _exports(events)  # nothing to export without LoRA


def test_hf_gpt2_from_a_directory_with_its_tokenizer_trains_lora_under_fsdp_like_single(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    single = JobSpec.load(runs["gpt2_single"] / "spec.json")
    assert single.model.hf is not None and single.model.hf.path_or_id is not None
    vocab = len(AutoTokenizer.from_pretrained(single.model.hf.path_or_id))
    reference = read_events(runs["gpt2_single"] / "run")
    events = read_events(runs["gpt2_fsdp"] / "run")
    _assert_close(losses_of(events), losses_of(reference), list(range(1, MAX_STEPS + 1)))
    assert _final_eval_loss(events) == pytest.approx(
        _final_eval_loss(reference), rel=EVAL_REL_TOLERANCE
    )
    # The data went through the model's tokenizer: a BPE id carries more than a byte does
    # (the unigram baseline of this corpus is ~3.1 nats per byte).
    assert statuses(events)[0]["data"]["unigram_eval_loss"] > 4.0

    merged_dir = _exports(events)["merged_safetensors"]
    assert (merged_dir / "tokenizer.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    assert merged.config.vocab_size == vocab
    model = HFCausalLM(merged, seq_len=single.model.seq_len)
    loss = _eval_loss_of(model, single, tmp_path / "eval")
    assert loss == pytest.approx(_final_eval_loss(events), rel=EVAL_REL_TOLERANCE)


def test_lora_fine_tune_of_an_earlier_run_starts_from_its_weights_and_resumes(
    runs: dict[str, Path],
) -> None:
    """--init-from gives the frozen base its weights on every attempt (the adapter-only
    checkpoints do not hold them); B = 0 at the start, so the step-0 eval loss is the
    earlier run's final one."""
    pretrained = read_events(runs["pre"] / "run")
    step_uri = statuses(pretrained)[-1]["data"]["checkpoint_uri"]
    events = read_events(runs["lora_single"] / "run")
    assert statuses(events)[0]["data"]["init_from"] == step_uri
    (start,) = [e for e in events if e["type"] == "metric" and e["step"] == 0]
    want = _final_eval_loss(pretrained)
    assert start["values"]["eval_loss"] == pytest.approx(want, rel=EVAL_REL_TOLERANCE)
    assert _final_eval_loss(events) < want  # the adapters learned on top of it

    again = read_events(runs["lora_single_crashed"] / "run")
    _assert_close(losses_of(again, attempt=1), losses_of(events), list(range(4, MAX_STEPS + 1)))
