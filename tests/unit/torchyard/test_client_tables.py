"""Issue 45, item 5: list tables fit the terminal without cutting what a user copies. Ids stay
whole, names are cut in their middle, long values (paths, scores) are never split, low-value
columns go first; each table at 80 and at 200 columns."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from rich.text import Text

from torchyard.access import ApiKey
from torchyard.cli.access import keys_table
from torchyard.cli.code import _table as code_table
from torchyard.cli.workers import workers_table
from torchyard.render import (
    checkpoints_table,
    dataset_files_table,
    datasets_table,
    evaluations_table,
    jobs_table,
    metrics_table,
)
from torchyard.summary import JobSummary, render_summary
from torchyard.tables import Column, ListTable, cut_middle
from torchyard.types import (
    Checkpoint,
    CodeArchive,
    Dataset,
    DatasetFile,
    Evaluation,
    Job,
    MetricSeries,
)
from torchyard.workers import Worker

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
LONG_NAME = "quickstart-gpt-small-lr-3e-4-warmup-100-cosine-7"
LONG_PATH = "/home/ada/.torchyard/quickstart/storage/datasets/ds_2c9f17d0a1b2c3d4/corpus.jsonl"
DATASET_ID = "ds_2c9f17d0a1b2c3d4e5f60718"
KEY_ID = "key_0123456789abcdef0123"


def _print(renderable: object, width: int) -> str:
    """As the CLI's consoles print it (`torchyard.cli.common.out`: soft wrap)."""
    console = Console(record=True, width=width, color_system=None, soft_wrap=True)
    console.print(renderable)
    return console.export_text()


def _job(**kw: object) -> Job:
    fields: dict[str, object] = {
        "id": 1234,
        "name": LONG_NAME,
        "state": "running",
        "pool": "a-rather-long-pool-name",
        "current_step": 120,
        "max_steps": 600,
        "latest_metrics": {"loss": 2.34567},
        "created_at": NOW - timedelta(minutes=5),
    }
    return Job.model_validate({**fields, **kw})


def test_cut_middle_keeps_both_ends_around_an_ellipsis() -> None:
    assert cut_middle(Text("quickstart-7"), 9).plain == "quic…rt-7"
    assert cut_middle(Text("quickstart-7"), 12).plain == "quickstart-7"
    assert len(cut_middle(Text(LONG_NAME), 16).plain) == 16


def test_a_narrow_table_drops_columns_by_rank_and_keeps_ids_whole() -> None:
    table = ListTable(
        Column("ID", "id"),
        Column("NAME", "name"),
        Column("EXTRA", "text", drop=2),
        Column("NOISE", "text", drop=1),
    )
    table.add_row("id_" + "0" * 30, "n" * 20, "e" * 20, "x" * 20)
    header = _print(table, 80).splitlines()[0].split()
    assert header == ["ID", "NAME", "EXTRA"]  # NOISE (drop=1) went first
    assert _print(table, 60).splitlines()[0].split() == ["ID", "NAME"]
    assert _print(table, 200).splitlines()[0].split() == ["ID", "NAME", "EXTRA", "NOISE"]
    assert "id_" + "0" * 30 in _print(table, 40)


def test_jobs_at_80_columns_cut_a_long_name_in_its_middle_on_one_line() -> None:
    text = _print(jobs_table([_job(), _job(id=7, name="gpt-small")], now=NOW), 80)
    header, first, second = text.splitlines()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "POOL" not in header.split(), "POOL is dropped first on a narrow terminal"
    cell = first.split()[1]
    head, _, tail = cell.partition("…")
    assert head and tail and LONG_NAME.startswith(head) and LONG_NAME.endswith(tail), text
    assert second.split()[:2] == ["7", "gpt-small"]


def test_jobs_at_200_columns_show_every_column_and_the_whole_name() -> None:
    text = _print(jobs_table([_job()], now=NOW), 200)
    assert text.splitlines()[0].split() == [
        "ID", "NAME", "STATE", "STEP", "LOSS", "KIND", "POOL", "CREATED", "QUEUE",
    ]  # fmt: skip
    assert LONG_NAME in text and "…" not in text


def _dataset() -> Dataset:
    return Dataset(
        id=DATASET_ID, name="stdlib-python-sources", uri=LONG_PATH, format="text",
        size_bytes=8_000_000, num_files=4_321, created_at=NOW,
    )  # fmt: skip


def test_datasets_at_80_columns_keep_the_id_whole_and_the_uri_whole_on_its_own_line() -> None:
    text = _print(datasets_table([_dataset()], now=NOW), 80)
    assert DATASET_ID in text
    assert LONG_PATH in text.splitlines()[2], text  # under its row, one line, not split
    assert all(len(line) <= 80 for line in text.splitlines() if LONG_PATH not in line)
    wide = _print(datasets_table([_dataset()], now=NOW), 200)
    assert wide.splitlines()[0].split()[-1] == "URI" and LONG_PATH in wide.splitlines()[1]


def _series(name: str, values: list[float]) -> MetricSeries:
    steps = list(range(1, len(values) + 1))
    return MetricSeries.model_validate({"name": name, "steps": steps, "values": values})


TABLES: dict[str, Callable[[], object]] = {
    "jobs": lambda: jobs_table([_job(), _job(id=7, state="queued")], now=NOW),
    "datasets": lambda: datasets_table([_dataset()], now=NOW),
    "dataset files": lambda: dataset_files_table(
        [DatasetFile(path=LONG_PATH.lstrip("/"), size_bytes=13_100)]
    ),
    "checkpoints": lambda: checkpoints_table(
        [Checkpoint(id=31, job_id=40, step=200, attempt=1, size_bytes=812, uri=LONG_PATH)]
    ),
    "evals": lambda: evaluations_table(
        [
            Evaluation(
                id=5,
                job_id=41,
                source_job_id=40,
                step=200,
                checkpoint_id=31,
                name=LONG_NAME,
                kind="generate",
                dataset=DATASET_ID,
                metrics={"exact_match": 0.8125, "chrf": 45.23, "loss": 2.25, "tokens": 12_800},
            )
        ]
    ),
    "metrics": lambda: metrics_table(
        [_series("sys/rss_bytes/0", [1.3e9]), _series("tokens_per_second", [20_600.0])]
    ),
    "workers": lambda: workers_table(
        [
            Worker(
                name="worker-" + "a" * 30,
                pool="default,gpu-h100,cpu-large",
                host="node-17.lan",
                slots_total=8,
                slots_free=3,
                started_at=NOW,
                heartbeat_at=NOW,
                alive=True,
                sandbox="none: bubblewrap is not installed on this host",
            )
        ],
        now=NOW,
    ),
    "code": lambda: code_table(
        [
            CodeArchive(
                id="code_0123456789abcdef0123",
                name=LONG_NAME,
                format="tar.gz",
                sha256="ab" * 32,
                size_bytes=13_100,
                unpacked_bytes=40_000,
                num_files=12,
                created_at=NOW,
            )
        ]
    ),
    "keys": lambda: keys_table(
        [
            ApiKey(
                id=KEY_ID,
                name="ci-deploys",
                prefix="ty_abcd",
                scopes=["jobs:read", "jobs:write"],
                role="member",
                owner=None,
                org_admin=False,
                created_at=NOW,
                expires_at=NOW,
                last_used_at=NOW,
                revoked_at=None,
            )
        ]
    ),
}
WHOLE = (DATASET_ID, KEY_ID, "code_0123456789abcdef0123", "1234", "exact_match 0.8125")


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("name", list(TABLES))
def test_every_list_table_fits_its_width_and_keeps_ids_and_long_values_whole(
    name: str, width: int
) -> None:
    text = _print(TABLES[name](), width)
    lines = text.splitlines()
    long_lines = [line for line in lines if LONG_PATH.lstrip("/") in line or "chrf" in line]
    assert all(len(line) <= width for line in lines if line not in long_lines), text
    assert all(len(line.split()) > 0 for line in lines), "no blank lines inside a table"
    wide = _print(TABLES[name](), 200)
    assert all(value in text for value in WHOLE if value in wide), text
    if name in ("datasets", "dataset files", "checkpoints"):
        assert any(LONG_PATH.lstrip("/") in line for line in lines), text
    if name == "evals":
        assert "exact_match 0.8125  chrf 45.23  loss 2.25  tokens 12,800" in text, text


def test_the_end_summary_prints_the_checkpoint_path_whole_on_one_line_at_80_columns() -> None:
    """Issue 45, item 5: the quickstart's and `submit --follow`'s summary split the path."""
    summary = JobSummary(
        job_id=17, name="quickstart", state="succeeded", step=200, max_steps=200,
        final_loss=1.2, final_eval_loss=1.3, unigram_eval_loss=None, tokens_per_second=16e3,
        checkpoint_uri=LONG_PATH, sample_prompt=None, sample_text=None, duration_s=200.0,
        error=None,
    )  # fmt: skip
    lines = _print(render_summary(summary), 80).splitlines()
    assert [line.split() for line in lines if LONG_PATH in line] == [["checkpoint", LONG_PATH]]
    assert lines[-1].index(LONG_PATH) == lines[0].index("17"), "aligned with the other values"
