"""``torchyard quickstart --example chat-sft|dpo|grpo``: the fine-tuning examples, offline.

`prepare` writes the examples' data (`demos.docstrings`: stdlib functions and their docstrings
as messages and preference JSONL; `demos.sums`: sums of two small numbers, noisily labelled for
SFT and as prompts with their true answers for GRPO) and builds the model directory (a small
Llama and a locally trained ChatML BPE) under ``HOME/examples``, which it adds to the allowed
data roots. The model is built by ``python -m demos.offline_llama`` in a child process: it
needs torch, `tokenizers` and `transformers`, which the client must not import (the quickstart
already runs the API and worker locally, so the trainer's packages are there). `submit` uploads
the data over REST and runs the example's `STAGES` one after the other, each later one from the
checkpoint of the one before: `chat_sft.yaml` (then `dpo.yaml` for ``dpo``), or `sums_sft.yaml`
then `grpo.yaml` for ``grpo``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from demos.docstrings import ExampleData, write_example_data
from demos.sums import SumsData, write_sums_data
from torchyard.client import Client
from torchyard.errors import TorchyardError
from torchyard.examples import load_example
from torchyard.summary import JobSummary, render_summary
from torchyard.types import Dataset, Job


class Example(StrEnum):
    """`--example` choices: the default GPT run on raw text and the fine-tuning examples."""

    gpt = "gpt"
    chat_sft = "chat-sft"
    dpo = "dpo"
    grpo = "grpo"


MODEL_DIR = "docstring-llama"
Follow = Callable[[Client, int], JobSummary]


@dataclass(frozen=True)
class Inputs:
    """What `prepare` made: the example data files and the model directory."""

    data: ExampleData
    model_dir: Path
    sums: SumsData | None = None


@dataclass(frozen=True)
class Stage:
    """One job of an example: its spec (`torchyard/examples/<spec>.yaml`), its training data
    and its evaluation data (None: the spec's held-out share) among `Inputs`' files. A stage
    after the first starts from the checkpoint of the one before (`model.init_from.job`)."""

    spec: str
    data: Callable[[Inputs], Path]
    eval_data: Callable[[Inputs], Path] | None = None


def _sums(inputs: Inputs) -> SumsData:
    assert inputs.sums is not None, "prepare writes the sums data"
    return inputs.sums


CHAT_SFT = Stage("chat_sft", lambda i: i.data.messages)
#: Each example's jobs, in order.
STAGES: dict[str, tuple[Stage, ...]] = {
    Example.chat_sft: (CHAT_SFT,),
    # DPO is evaluated on its training pairs (see dpo.yaml)
    Example.dpo: (CHAT_SFT, Stage("dpo", lambda i: i.data.preference, lambda i: i.data.preference)),
    Example.grpo: (
        Stage("sums_sft", lambda i: _sums(i).messages),
        Stage("grpo", lambda i: _sums(i).prompts, lambda i: _sums(i).heldout),
    ),
}


def examples_root(home: Path) -> Path:
    """Where the fine-tuning examples keep their data and model (an allowed data root)."""
    return home / "examples"


def model_argv(out: Path) -> list[str]:
    """The child process that builds the example's model and tokenizer into `out`."""
    return [sys.executable, "-m", "demos.offline_llama", str(out)]


def prepare(home: Path, console: Console) -> Inputs:
    """Write the data and, unless a previous run did, build the model under `home`.

    Raises `TorchyardError` when the model cannot be built (its output tail says why)."""
    root = examples_root(home)
    data = write_example_data(root / "data")
    sums = write_sums_data(root / "data")
    model_dir = root / MODEL_DIR
    if not (model_dir / "config.json").is_file():
        console.print(Text(f"building the example model in {model_dir} ...", style="dim"))
        done = subprocess.run(model_argv(model_dir), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
            raise TorchyardError(
                f"building the example model failed (exit {done.returncode}); it needs the "
                f"trainer's packages (pip install 'torchyard[trainer]'):\n{tail}"
            )
    return Inputs(data=data, model_dir=model_dir, sums=sums)


def example_spec(
    name: str, inputs: Inputs, dataset_id: str, prepare_spec: Callable[[dict[str, Any]], Any]
) -> dict[str, Any]:
    """The example spec `name` with its model directory and dataset filled in, then
    `prepare_spec` (the quickstart's options and overrides) applied."""
    spec = load_example(name)
    spec["model"]["hf"]["path_or_id"] = str(inputs.model_dir)
    spec["data"]["dataset"] = dataset_id
    result: dict[str, Any] = prepare_spec(spec)
    return result


def submit(
    client: Client,
    example: str,
    inputs: Inputs,
    *,
    prepare_spec: Callable[[dict[str, Any]], dict[str, Any]],
    follow: Follow,
    console: Console,
    on_job: Callable[[Job], None],
) -> JobSummary:
    """Upload the data and run the example's `STAGES` one after the other, each followed live;
    returns the last job's summary (or the first that did not succeed). `on_job` is told of
    each job as it is created (so the caller can cancel it on the way out)."""
    previous: Job | None = None
    summary: JobSummary | None = None
    for stage in STAGES[example]:
        if summary is not None:
            if not summary.succeeded:
                return summary
            console.print(render_summary(summary))
        dataset = upload_once(client, stage.data(inputs))
        console.print(Text(f"dataset {dataset.id}: {dataset.name}", style="dim"))
        spec = example_spec(stage.spec, inputs, dataset.id, prepare_spec)
        if stage.eval_data is not None:
            spec["data"]["eval_dataset"] = upload_once(client, stage.eval_data(inputs)).id
        if previous is not None:
            spec["model"]["init_from"] = {"job": previous.id}
        previous = client.jobs.create(spec)
        on_job(previous)
        summary = follow(client, previous.id)
    assert summary is not None, "every example has a stage"
    return summary


def upload_once(client: Client, path: Path) -> Dataset:
    """The dataset of `path`'s content: one uploaded before under the same name (the file's
    stem and the start of its SHA-256), else a new upload (the server checks each record)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    name = f"{path.name.split('.')[0]}-{path.name.split('.')[1]}-{digest}"
    for dataset in client.datasets.list():
        if dataset.name == name:
            return dataset
    return client.datasets.upload(name, path)
