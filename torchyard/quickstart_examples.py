"""``torchyard quickstart --example chat-sft|dpo``: the fine-tuning examples, offline.

`prepare` writes the example's data (`torchyard.examples.docstrings`: stdlib functions and
their docstrings as messages and preference JSONL) and builds its model directory (a small
Llama and a locally trained ChatML BPE) under ``HOME/examples``, which it adds to the
allowed data roots. The model is built by ``python -m trainer.models.offline`` in a child
process: it needs torch, `tokenizers` and `transformers`, which the client must not import
(the quickstart already runs the API and worker locally, so the trainer's packages are
there). `submit` uploads the data over REST and runs `chat_sft.yaml`, then for ``dpo``
`dpo.yaml` from the SFT job's checkpoint.
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

from torchyard.client import Client
from torchyard.errors import TorchyardError
from torchyard.examples import load_example
from torchyard.examples.docstrings import ExampleData, write_example_data
from torchyard.summary import JobSummary, render_summary
from torchyard.types import Dataset, Job


class Example(StrEnum):
    """`--example` choices: the default GPT run on raw text and the fine-tuning examples."""

    gpt = "gpt"
    chat_sft = "chat-sft"
    dpo = "dpo"


MODEL_DIR = "docstring-llama"
Follow = Callable[[Client, int], JobSummary]


@dataclass(frozen=True)
class Inputs:
    """What `prepare` made: the example data files and the model directory."""

    data: ExampleData
    model_dir: Path


def examples_root(home: Path) -> Path:
    """Where the fine-tuning examples keep their data and model (an allowed data root)."""
    return home / "examples"


def model_argv(out: Path) -> list[str]:
    """The child process that builds the example's model and tokenizer into `out`."""
    return [sys.executable, "-m", "trainer.models.offline", str(out)]


def prepare(home: Path, console: Console) -> Inputs:
    """Write the data and, unless a previous run did, build the model under `home`.

    Raises `TorchyardError` when the model cannot be built (its output tail says why)."""
    root = examples_root(home)
    data = write_example_data(root / "data")
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
    return Inputs(data=data, model_dir=model_dir)


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
    """Upload the data and run the example's jobs one after the other, each followed live;
    returns the last job's summary (or the first that did not succeed). `on_job` is told of
    each job as it is created (so the caller can cancel it on the way out)."""
    messages = upload_once(client, inputs.data.messages)
    console.print(Text(f"dataset {messages.id}: {messages.name}", style="dim"))
    spec = example_spec("chat_sft", inputs, messages.id, prepare_spec)
    job = client.jobs.create(spec)
    on_job(job)
    summary = follow(client, job.id)
    if example == "chat-sft" or not summary.succeeded:
        return summary
    console.print(render_summary(summary))
    pairs = upload_once(client, inputs.data.preference)
    console.print(Text(f"dataset {pairs.id}: {pairs.name}", style="dim"))
    spec = example_spec("dpo", inputs, pairs.id, prepare_spec)
    spec["data"]["eval_dataset"] = pairs.id  # the training pairs (see dpo.yaml)
    spec["model"]["init_from"] = {"job": job.id}
    dpo = client.jobs.create(spec)
    on_job(dpo)
    return follow(client, dpo.id)


def upload_once(client: Client, path: Path) -> Dataset:
    """The dataset of `path`'s content: one uploaded before under the same name (the file's
    stem and the start of its SHA-256), else a new upload (the server checks each record)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    name = f"{path.name.split('.')[0]}-{path.name.split('.')[1]}-{digest}"
    for dataset in client.datasets.list():
        if dataset.name == name:
            return dataset
    return client.datasets.upload(name, path)
