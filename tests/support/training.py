"""Helpers for the trainer tests: tiny specs, real `torchrun` launches, reading events.

Test modules import it (`from tests.support.training import ...`). The corpus is the session's
`corpus_dir` fixture (tests/conftest.py). `run_scenarios` / `run_plans` run a module's
trainer runs in one process group per world size (`tests.support.rank_driver`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jobspec.job import JobSpec
from trainer.data.prep import prepare_rows
from trainer.data.rows import IGNORE_INDEX, Rows
from trainer.distributed import DistInfo
from trainer.events import NullReporter, Reporter
from trainer.loop import Run
from trainer.models.hf import load_tokenizer
from trainer.train import build_run
from workers.launcher import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 180
# A 2-layer Llama for `model.hf.from_config` (GQA: 4 query heads over 2 key/value heads), byte
# vocabulary, 128 positions: the Hugging Face model of the fine-tuning and DPO tests.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


# The `model` section of a LoRA/QLoRA test's spec: a fine-tune of job 1's checkpoint, as a
# submission must say (LoRA on a random initialisation is refused). A test that builds the
# network in this process without `init_from=URI` keeps the seeded base weights, which is all
# that what it checks needs: which parameters train, what a checkpoint holds, the errors raised
# before any weight is read. A test of what a fine-tune learns starts from a real checkpoint.
FINE_TUNE: dict[str, Any] = {"init_from": {"job": 1, "checkpoint": 1}}


def stdlib_corpus(out: Path, size: int = 400_000) -> Path:
    """Copy the standard library's top-level `*.py` files, in name order, into `out` until
    just past `size` bytes: a small real text corpus. Returns `out`."""
    import sysconfig

    total = 0
    for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = src.read_bytes()
        (out / src.name).write_bytes(data)
        total += len(data)
        if total > size:
            break
    return out


def tiny_llama_dir(out: Path) -> Path:
    """`TINY_LLAMA` with seeded weights saved to `out` (`save_pretrained`, no tokenizer: byte
    ids): a Hugging Face model whose weights come from files, for a LoRA test to fine-tune
    (`model.hf.path_or_id`; LoRA on `from_config`'s random init is refused). Returns `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **shape)).save_pretrained(out)
    return out


def hf_model_with_tokenizer(corpus_dir: Path, out: Path, *, model_type: str = "llama") -> int:
    """A 2-layer `model_type` (`gpt2` or `llama`) and a 400-id byte-level BPE tokenizer
    trained on a few corpus files, saved to `out` with `save_pretrained` (no downloads).
    Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [p.read_text(errors="replace") for p in sorted(corpus_dir.glob("*.py"))[:5]]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    if model_type == "gpt2":
        config = AutoConfig.for_model(
            "gpt2", n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=len(tokenizer),
            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
    else:
        shape = {k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "vocab_size")}
        config = AutoConfig.for_model(
            model_type, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, **shape
        )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return len(tokenizer)


def tiny_spec(data: Path, **sections: dict[str, Any]) -> JobSpec:
    """A 2-layer, d_model 64, seq_len 64 GPT spec on `data`; `sections` update its parts,
    e.g. `train={"max_steps": 5}`."""
    raw: dict[str, Any] = {
        "name": "tiny",
        "seed": 1234,
        "data": {"uri": str(data)},
        "model": {"n_layers": 2, "n_heads": 4, "d_model": 64, "seq_len": 64},
        "parallelism": {"strategy": "single"},
        "resources": {"procs_per_node": 1},
        "optim": {"lr": 3e-3, "warmup_steps": 5, "schedule": "constant"},
        "train": {"micro_batch_size": 16, "max_steps": 20, "log_interval_steps": 1},
        "eval": {"interval_steps": 10, "num_batches": 4},
        "checkpoint": {"interval_steps": 10, "keep_last": 2},
        "sample": {"prompt": "def ", "max_new_tokens": 32},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    steps = raw["train"].get("max_steps")
    if "warmup_steps" not in sections.get("optim", {}) and steps is not None:
        # this spec's 5 warmup steps, at most the run (a longer warmup is refused)
        raw["optim"]["warmup_steps"] = min(raw["optim"]["warmup_steps"], steps)
    return JobSpec.model_validate(raw)


def validation_spec(nproc: int, parallelism: dict[str, Any], **sections: dict[str, Any]) -> JobSpec:
    """A spec that is only validated, never run: 4 blocks of d_model 64 on dataset `ds_1`,
    `nproc` processes per node with `parallelism`; `sections` update its parts."""
    raw: dict[str, Any] = {
        "name": "job",
        "data": {"dataset": "ds_1"},
        "model": {"n_layers": 4, "n_heads": 4, "d_model": 64},
        "parallelism": parallelism,
        "resources": {"procs_per_node": nproc},
        "train": {"micro_batch_size": 16},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return JobSpec.model_validate(raw)


def trainer_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer process: one OMP thread per process, no stray fault."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def trainer_command(
    spec_path: Path,
    run_dir: Path,
    checkpoint_dir: Path,
    *,
    nproc: int | None,
    crash_after_step: int | None = None,
) -> list[str]:
    """`torchrun ... -m trainer ...` for `nproc` processes, or `python -m trainer` if None.
    With `crash_after_step` N the module is `tests.support.crashing_trainer`: every rank exits 1
    right after step N (and its checkpoint, if one is due) is complete."""
    args = ["--spec", str(spec_path), "--run-dir", str(run_dir)]
    args += ["--checkpoint-dir", str(checkpoint_dir)]
    module = ["-m", "trainer"]
    if crash_after_step is not None:
        module = [
            "-m",
            "tests.support.crashing_trainer",
            "--crash-after-step",
            str(crash_after_step),
        ]
    return [*_launcher(nproc), *module, *args]


def _launcher(nproc: int | None) -> list[str]:
    """`torchrun` for `nproc` processes on this host, or the plain interpreter if None."""
    if nproc is None:
        return [sys.executable]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    launcher += ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
    return [*launcher, "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]


@dataclass
class Scenario:
    """One trainer run of a `run_scenarios` batch: `spec` in `workdir` (spec.json, run/,
    ckpt/), `args` appended to the trainer's command line, `env` set for this run only,
    `crash_after_step` N: every rank crashes right after step N (`SimulatedCrash`),
    `copy_checkpoints_from`: a workdir whose ckpt/ is copied into this one's first, less the
    names in `copy_ignore`."""

    name: str
    spec: JobSpec
    workdir: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    crash_after_step: int | None = None
    copy_checkpoints_from: Path | None = None
    copy_ignore: tuple[str, ...] = ()


def run_scenarios(
    scenarios: list[Scenario], *, nproc: int | None, plan_dir: Path
) -> dict[str, dict[str, str]]:
    """Run `scenarios` in order in one process group of `nproc` ranks under real torchrun
    (`None`: one plain process), through `tests.support.rank_driver`; {name: {"outcome",
    "message"}} (outcome `ok`, `crashed`, `exit N` or `error`). Fails the test when the driver
    itself fails or leaves a scenario unrun."""
    plan_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for s in scenarios:
        s.workdir.mkdir(parents=True, exist_ok=True)
        s.spec.dump(s.workdir / "spec.json")
        argv = ["--spec", str(s.workdir / "spec.json"), "--run-dir", str(s.workdir / "run")]
        argv += ["--checkpoint-dir", str(s.workdir / "ckpt"), *s.args]
        copy = None
        if s.copy_checkpoints_from is not None:
            copy = [str(s.copy_checkpoints_from / "ckpt"), str(s.workdir / "ckpt"), *s.copy_ignore]
        entries.append(
            {"name": s.name, "argv": argv, "env": s.env, "crash_after_step": s.crash_after_step,
             "copy": copy}
        )  # fmt: skip
    results_path = plan_dir / "results.json"
    plan = plan_dir / "plan.json"
    plan.write_text(json.dumps({"results": str(results_path), "scenarios": entries}))
    cmd = [*_launcher(nproc), "-m", "tests.support.rank_driver", "--plan", str(plan)]
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S * len(scenarios),
        check=False,
    )
    assert proc.returncode == 0 and results_path.exists(), explain(proc)
    results: dict[str, dict[str, str]] = json.loads(results_path.read_text())
    assert list(results) == [s.name for s in scenarios], explain(proc)
    return results


def crash_and_resume(
    name: str, spec: JobSpec, workdir: Path, fail_at: int, args: tuple[str, ...] = ()
) -> list[Scenario]:
    """Scenarios `name/crash` (crashes right after step `fail_at`) and `name/resume` (the
    next attempt, `TORCHYARD_ATTEMPT=1`, resumed from the newest checkpoint), in `workdir`."""
    return [
        Scenario(f"{name}/crash", spec, workdir, args, crash_after_step=fail_at),
        Scenario(f"{name}/resume", spec, workdir, args, env={"TORCHYARD_ATTEMPT": "1"}),
    ]


def run_plans(plans: list[tuple[int | None, list[Scenario]]], plan_root: Path) -> dict[str, Path]:
    """Run each (nproc, scenarios) plan in order (`run_scenarios`), check each scenario ended
    as its name says (`x/crash` crashed, every other one completed) and return {run: workdir},
    where a crash and its resume are one run `x`."""
    workdirs: dict[str, Path] = {}
    for i, (nproc, scenarios) in enumerate(plans):
        results = run_scenarios(scenarios, nproc=nproc, plan_dir=plan_root / f"plan_{i}")
        for scenario in scenarios:
            run, _, attempt = scenario.name.partition("/")
            outcome = results[scenario.name]["outcome"]
            want = "crashed" if attempt == "crash" else "ok"
            assert outcome == want, f"{scenario.name}: {results[scenario.name]}"
            workdirs[run if attempt in ("crash", "resume") else scenario.name] = scenario.workdir
    return workdirs


def start_trainer(cmd: list[str]) -> subprocess.Popen[str]:
    """Start a trainer command (`trainer_command`) in the repository with `trainer_env()`; its
    stdout and stderr are one text pipe, for the caller to read and to wait on."""
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_trainer(
    spec: JobSpec,
    workdir: Path,
    *,
    nproc: int | None,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    crash_after_step: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write `spec` to `workdir/spec.json` and run the trainer on it to the end, or with
    `crash_after_step` N until every rank exits 1 after step N (`tests.support.crashing_trainer`).

    Run dir `workdir/run`, checkpoints `workdir/ckpt`; `args` are appended to the trainer's
    command line (e.g. `--init-from URI`); stdout and stderr are captured.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec.dump(workdir / "spec.json")
    paths = (workdir / "spec.json", workdir / "run", workdir / "ckpt")
    cmd = trainer_command(*paths, nproc=nproc, crash_after_step=crash_after_step)
    cmd += args
    return subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env=trainer_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """All events of `run_dir/events.jsonl`, in order."""
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def train_losses(events: list[dict[str, Any]], attempt: int = 0) -> dict[int, float]:
    """{step: train loss} of one attempt."""
    return {
        e["step"]: e["values"]["loss"]
        for e in events
        if e["type"] == "metric" and e["attempt"] == attempt and "loss" in e["values"]
    }


def statuses(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "status"]


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    """The tail of a process's output, for assertion messages."""
    return f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


def cpu_world_of_one() -> DistInfo:
    """The `DistInfo` of a stand-alone process: no process group, CPU."""
    return DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def build_local_run(
    spec: JobSpec,
    checkpoint_dir: Path,
    reporter: Reporter | None = None,
    *,
    device: torch.device | None = None,
) -> Run:
    """A world-of-one `Run` built in this process, as `python -m trainer` would build it, on
    the CPU unless `device` is given."""
    assert spec.data.uri is not None
    prepared = prepare_rows(
        spec,
        spec.data.uri,
        load_tokenizer(spec.model),
        cache_dir=checkpoint_dir.parent / f"{checkpoint_dir.name}-rows",
        dist=None,
        reporter=NullReporter(),
    )
    assert isinstance(prepared.train, Rows) and isinstance(prepared.eval, Rows)
    return build_run(
        spec,
        prepared.train,
        prepared.eval,
        str(checkpoint_dir),
        DistInfo(rank=0, local_rank=0, world_size=1, device=device or torch.device("cpu")),
        reporter or NullReporter(),
    )


def uneven_rows(num_rows: int, seq_len: int, *, seed: int, segments: int = 1) -> Rows:
    """Rows of random byte tokens whose supervised lengths differ widely: row i supervises
    only its last 1 + (37 i mod seq_len) positions (a prompt before them). `segments` > 1
    packs that many equal examples per row (positions restart, each example's last position
    unsupervised), as `trainer.data.rows` lays out packed data."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, size=(num_rows, seq_len + 1), dtype=np.int32)
    labels = ids[:, 1:].copy()
    for i in range(num_rows):
        labels[i, : seq_len - (1 + (37 * i) % seq_len)] = IGNORE_INDEX
    example = seq_len // segments
    t = np.arange(seq_len, dtype=np.int32)
    if segments > 1:
        labels[:, (t + 1) % example == 0] = IGNORE_INDEX
    shape = (num_rows, seq_len)
    return Rows(
        input_ids=np.ascontiguousarray(ids[:, :-1]),
        labels=labels,
        position_ids=np.broadcast_to(t % example, shape),
        segment_ids=np.ascontiguousarray(np.broadcast_to(t // example, shape)),
    )


def build_rows_run(
    spec: JobSpec,
    rows: Rows,
    checkpoint_dir: Path,
    dist_info: DistInfo,
    reporter: Reporter | None = None,
) -> Run:
    """A `Run` of `spec` training and evaluating on `rows` (no corpus read)."""
    return build_run(spec, rows, rows, str(checkpoint_dir), dist_info, reporter or NullReporter())


def evaluate_in_process(
    source: JobSpec,
    checkpoint: dict[str, Any] | None,
    evaluations: list[dict[str, Any]],
    workdir: Path,
    **inputs: Any,
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Run an eval job's evaluations (`trainer.evaluate.run_evaluations`) in this process as
    one rank, on `checkpoint` ({id, step, uri}; None: `source`'s starting weights), with the
    locations a worker would resolve (`inputs` override them); (results, events written)."""
    from jobspec.job import EvalJobSpec
    from trainer.evaluate import run_evaluations
    from trainer.events import EventWriter

    pinned = {"job": 1, "initial": True} if checkpoint is None else {"job": 1, "checkpoint": 1}
    job = EvalJobSpec.model_validate(
        {"name": "eval", "evaluate": {"source": pinned, "evaluations": evaluations}}
    )
    located = {
        "checkpoint": checkpoint,
        "source_spec": source.model_dump(mode="json"),
        "source_job": 1,
        "source_data": source.data.uri,
        "source_eval_data": None,
        "source_init_from": None,
        "source_model": None,
        "datasets": {},
        "task_datasets": {},
        "lm_eval_task_dirs": [],
        **inputs,
    }
    run_dir = workdir / "eval_run"
    reporter = EventWriter(run_dir)
    try:
        results = run_evaluations(job, located, workdir / "cache", cpu_world_of_one(), reporter)
    finally:
        reporter.close()
    return results, read_events(run_dir)
