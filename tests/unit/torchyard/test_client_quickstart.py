"""The quickstart submits a valid spec and configures the embedded default without
overriding what the user set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobspec.job import JobSpec
from torchyard.cli import app
from torchyard.examples import load_example
from torchyard.quickstart import (
    STDLIB,
    Options,
    QuickstartError,
    build_spec,
    corpus_include,
    dataset_name,
    embedded_env,
    example_spec,
    run,
    with_data_root,
)
from torchyard.quickstart_examples import STAGES, Inputs
from torchyard.quickstart_examples import example_spec as fine_tuning_spec


def _valid(spec: dict) -> JobSpec:
    return JobSpec.model_validate({**spec, "data": {**spec["data"], "dataset": "ds_test"}})


def test_default_spec_is_the_documented_gpt_run() -> None:
    spec = _valid(build_spec(example_spec(), Options()))
    assert (spec.model.n_layers, spec.model.d_model, spec.model.n_heads) == (4, 128, 4)
    assert spec.model.seq_len == 128
    assert (spec.train.max_steps, spec.train.micro_batch_size, spec.optim.lr) == (600, 16, 2e-3)
    assert (spec.eval.interval_steps, spec.checkpoint.interval_steps) == (100, 200)
    assert "include" not in spec.data.model_fields_set  # the dataset's filter applies
    assert spec.data.max_bytes == 8_000_000
    assert spec.parallelism.strategy == "ddp" and spec.resources.procs_per_node == 2


def test_few_steps_cap_the_eval_and_checkpoint_intervals_and_the_warmup() -> None:
    spec = _valid(build_spec(example_spec(), Options(steps=30)))
    assert (spec.train.max_steps, spec.eval.interval_steps, spec.checkpoint.interval_steps) == (
        30, 30, 30,
    )  # fmt: skip
    assert spec.optim.warmup_steps == 30  # the example's 50 would outlast the run (a 422)


def test_one_proc_trains_a_single_process() -> None:
    spec = _valid(build_spec(example_spec(), Options(procs=1)))
    assert (spec.parallelism.strategy, spec.world_size) == ("single", 1)


def test_the_corpus_filter_is_the_datasets_stdlib_sources_else_every_file(
    tmp_path: Path,
) -> None:
    """The quickstart registers its corpus with the filter, so it travels with the dataset
    to every job on it (issue 45, item 1), and the spec leaves `include` alone."""
    assert corpus_include(STDLIB, []) == ["**/*.py"]
    assert corpus_include(tmp_path, []) is None  # the server's default: every text file
    assert corpus_include(tmp_path, ["*.md"]) == ["*.md"]
    (tmp_path / "one.txt").write_text("text\n")
    assert corpus_include(tmp_path / "one.txt", ["*.md"]) is None  # a file has no filter
    for opts in (Options(data=tmp_path), Options(data=tmp_path, include=["*.md"])):
        assert "include" not in build_spec(example_spec(), opts)["data"]


def test_set_overrides_apply_last() -> None:
    spec = build_spec(example_spec(), Options(steps=50, overrides=["train.max_steps=70"]))
    assert spec["train"]["max_steps"] == 70


def test_embedded_env_keeps_the_users_settings_under_the_chosen_home(tmp_path: Path) -> None:
    env = embedded_env(
        tmp_path,
        {"TORCHYARD_BROKER_URL": "redis://r:6379/0", "TORCHYARD_HOME": "/old", "PATH": "/bin"},
    )
    assert env["TORCHYARD_BROKER_URL"] == "redis://r:6379/0"
    assert env["TORCHYARD_DATABASE_URL"] == f"sqlite:///{tmp_path}/torchyard.db"
    assert env["TORCHYARD_STORAGE_URL"] == str(tmp_path / "storage")
    assert env["TORCHYARD_HOME"] == str(tmp_path)
    assert env["PATH"] == "/bin"


def test_user_data_becomes_an_allowed_root_next_to_existing_ones(tmp_path: Path) -> None:
    env = with_data_root({"TORCHYARD_DATA_ROOTS": json.dumps(["/srv/a"])}, tmp_path)
    assert json.loads(env["TORCHYARD_DATA_ROOTS"]) == ["/srv/a", str(tmp_path)]
    assert with_data_root(env, tmp_path) == env
    assert json.loads(with_data_root({}, tmp_path)["TORCHYARD_DATA_ROOTS"]) == [str(tmp_path)]


@pytest.mark.parametrize("path", [Path("/data/corpus.txt"), Path("/data/texts")])
def test_dataset_names_are_stable_per_path(path: Path) -> None:
    assert dataset_name(path) == dataset_name(Path(str(path)))
    assert dataset_name(path).startswith(path.name + "-")
    assert dataset_name(path) != dataset_name(path.parent / "other")


def test_stdlib_dataset_is_named_for_the_python_version() -> None:
    assert dataset_name(STDLIB).startswith("python3.") and dataset_name(STDLIB).endswith("-stdlib")


def test_help_offers_the_chat_sft_dpo_and_grpo_examples_next_to_the_default_gpt() -> None:
    result = CliRunner().invoke(app, ["quickstart", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "gpt|chat-sft|dpo|grpo" in result.output
    assert "[default: gpt]" in result.output
    assert Options().example == "gpt"


@pytest.mark.parametrize("name", ["chat_sft", "dpo"])
def test_fine_tuning_examples_are_valid_specs_once_model_and_data_are_filled_in(
    name: str, tmp_path: Path
) -> None:
    inputs = Inputs(data=None, model_dir=tmp_path / "model")  # type: ignore[arg-type]
    raw = fine_tuning_spec(name, inputs, "ds_test", lambda s: build_spec(s, Options(steps=4)))
    if name == "dpo":
        raw["model"]["init_from"] = {"job": 1}
    spec = JobSpec.model_validate(raw)
    assert spec.model.kind == "hf" and spec.model.hf is not None
    assert spec.model.hf.path_or_id == str(tmp_path / "model")
    assert spec.lora is not None and spec.train.max_steps == 4
    assert spec.parallelism.strategy == "ddp" and spec.resources.procs_per_node == 2
    assert spec.method.kind == ("dpo" if name == "dpo" else "sft")
    assert spec.data.packing == (name == "chat_sft")
    assert load_example(name)["data"]["dataset"] is None  # the example leaves it to be filled


def test_the_grpo_example_is_sums_sft_then_grpo_with_lora_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    inputs = Inputs(data=None, model_dir=tmp_path / "model")  # type: ignore[arg-type]
    sft_raw, grpo_raw = (
        fine_tuning_spec(stage.spec, inputs, "ds_test", lambda s: build_spec(s, Options()))
        for stage in STAGES["grpo"]
    )
    sft = JobSpec.model_validate(sft_raw)
    grpo_raw["model"]["init_from"] = {"job": 1}
    grpo_raw["data"]["eval_dataset"] = "ds_heldout"
    grpo = JobSpec.model_validate(grpo_raw)
    assert sft.method.kind == "sft" and sft.lora is None and sft.data.format == "messages"
    assert grpo.method.kind == "grpo" and grpo.lora is not None and grpo.data.format == "prompt"
    assert grpo.method.grpo is not None
    (grader,) = grpo.method.grpo.graders
    assert grader.type == "string_check" and "item.answer" in grader.reference
    assert grpo.model.seq_len == sft.model.seq_len, "the SFT model's positions are the GRPO's"
    assert [s.eval_data is None for s in STAGES["grpo"]] == [True, False]


def test_fine_tuning_examples_refuse_the_gpt_examples_data_options(tmp_path: Path) -> None:
    opts = Options(home=tmp_path, data=tmp_path, example="chat-sft")
    with pytest.raises(QuickstartError, match="--data and --include are for the gpt example"):
        run(opts, Console(file=None))
