"""Tables and numbers print what a person needs, and user text is never read as markup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console

from torchyard.failure_render import failure_block, where
from torchyard.render import (
    checkpoints_table,
    datasets_table,
    job_details,
    jobs_table,
    log_line,
    metrics_table,
    queue_text,
)
from torchyard.types import Checkpoint, Dataset, Failure, Job, LogLine, MetricSeries
from torchyard.units import format_bytes, format_duration, format_rate, format_value, format_when

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def _text(renderable: object) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def _job(**kw: object) -> Job:
    fields: dict[str, object] = {
        "id": 7,
        "name": "gpt-small",
        "state": "running",
        "pool": "default",
        "current_step": 120,
        "max_steps": 600,
        "latest_metrics": {"loss": 2.34567, "tokens_per_second": 51234.0},
        "created_at": NOW - timedelta(minutes=5),
    }
    fields.update(kw)
    return Job.model_validate(fields)


def test_jobs_table_has_one_row_per_job_with_step_and_loss() -> None:
    text = _text(jobs_table([_job(), _job(id=8, state="queued", current_step=None)], now=NOW))
    lines = [line.split() for line in text.splitlines() if line.strip()]
    assert lines[0] == [
        "ID", "NAME", "STATE", "STEP", "LOSS", "KIND", "POOL", "CREATED", "QUEUE",
    ]  # fmt: skip
    assert lines[1] == [
        "7", "gpt-small", "running", "120/600", "2.346", "trainer", "default", "5m00s", "ago", "-",
    ]  # fmt: skip
    assert lines[2][:4] == ["8", "gpt-small", "queued", "0/600"]


def test_markup_in_user_text_is_printed_literally() -> None:
    text = _text(job_details(_job(error="bad [red]thing[/red]", labels={"k": "[b]v"})))
    assert "bad [red]thing[/red]" in text
    assert "k=[b]v" in text


def test_job_details_list_latest_metrics_and_error() -> None:
    text = _text(job_details(_job(state="failed", exit_code=1, error="CUDA OOM")))
    assert "loss" in text and "2.346" in text
    assert "exit code" in text and "CUDA OOM" in text


def test_checkpoints_are_sorted_by_step_with_ids_sizes_and_export_state() -> None:
    cps = [
        Checkpoint(
            id=2,
            job_id=7,
            step=400,
            uri="/s/step_00000400",
            size_bytes=12_300_000,
            export={
                "id": 5,
                "job_id": 7,
                "checkpoint_id": 2,
                "step": 400,
                "state": "ready",
                "size_bytes": 4_100_000,
            },
        ),
        Checkpoint(id=1, job_id=7, step=200, uri="/s/step_00000200", size_bytes=812),
        Checkpoint(
            id=3,
            job_id=7,
            step=600,
            uri="/s/step_00000600",
            size_bytes=812,
            export={"id": 6, "job_id": 7, "checkpoint_id": 3, "step": 600, "state": "pending"},
        ),
    ]
    rows = [line.split() for line in _text(checkpoints_table(cps)).splitlines()[1:] if line]
    assert rows == [
        ["1", "200", "0", "812", "B", "-", "/s/step_00000200"],
        ["2", "400", "0", "12.3", "MB", "ready", "(4.1", "MB)", "/s/step_00000400"],
        ["3", "600", "0", "812", "B", "pending", "/s/step_00000600"],
    ]


def test_metrics_table_shows_last_min_max() -> None:
    series = MetricSeries.model_validate(
        {
            "name": "loss",
            "steps": [10, 20, 30],
            "values": [3.0, 2.0, 2.5],
            "last": {"step": 30, "value": 2.5},
        }
    )
    row = _text(metrics_table([series])).splitlines()[1].split()
    assert row == ["loss", "3", "30", "2.5", "2", "3"]


def test_datasets_table_shows_size_and_files() -> None:
    ds = Dataset(
        id="ds_1",
        name="stdlib",
        uri="/usr/lib/python3.11",
        size_bytes=8_000_000,
        num_files=42,
        created_at=NOW,
    )
    text = _text(datasets_table([ds], now=NOW))
    assert "ds_1" in text and "8.0 MB" in text and "42" in text


def test_log_lines_name_the_rank_or_the_launcher() -> None:
    assert log_line(LogLine(id=1, rank=1, line="step 10")) == "[rank 1] step 10"
    assert log_line(LogLine(id=2, rank=-1, line="torchrun ...")) == "[launcher] torchrun ..."


def test_number_formats() -> None:
    assert [format_duration(s) for s in (None, 42, 185, 3720, 2 * 86400 + 3 * 3600)] == [
        "-",
        "42s",
        "3m05s",
        "1h02m",
        "2d03h",
    ]
    assert [format_bytes(n) for n in (None, 999, 8_000_000)] == ["-", "999 B", "8.0 MB"]
    assert [format_value(v) for v in (None, 2.34567, 0.002, 0.0)] == ["-", "2.346", "0.002", "0"]
    rates = [format_rate(v) for v in (None, 950, 12_345, 4_100_000)]
    assert rates == ["-", "950", "12.3k", "4.10M"]


def test_non_finite_latest_metrics_arrive_as_null_and_print_as_dash() -> None:
    job = _job(latest_metrics={"loss": None, "lr": 0.002})
    text = _text(jobs_table([job], now=NOW))
    assert text.splitlines()[1].split()[4] == "-"


def test_failure_place_names_what_is_known_of_rank_host_and_exit() -> None:
    def place(**kw: object) -> str:
        return where(Failure.model_validate({"failure_class": "infra", "reason": "r", **kw}))

    assert place(rank=3, node_rank=1, host="host-b", exit_code=1) == "rank 3 on host-b, exit 1"
    assert place(rank=3, node_rank=1) == "rank 3 on node 1"
    assert place(node_rank=2) == "on node 2"
    assert place(exit_code=-9) == "exit -9"
    assert place() == ""


def test_a_failed_job_without_a_recorded_failure_says_its_error() -> None:
    job = _job(state="failed", error="max_runtime_s exceeded (60 s)\nmore")
    assert _text(failure_block(job)).splitlines()[0] == "failed: max_runtime_s exceeded (60 s)"
    assert failure_block(_job()) is None


def test_markup_in_a_failure_reason_or_log_line_is_printed_literally() -> None:
    failure = {"failure_class": "user_error", "reason": "bad [red]x[/red]", "log_tail": ["[b]y"]}
    text = _text(failure_block(_job(state="failed", failure=failure)))
    assert text.splitlines()[0] == "failed: [user_error] bad [red]x[/red]"
    assert "  [b]y" in text


def test_waiting_jobs_show_their_place_reason_and_estimated_start() -> None:
    queued = _job(
        id=9,
        state="queued",
        current_step=None,
        queue={
            "position": 3,
            "reason": "quota gpus 2/2",
            "estimated_start_at": (NOW + timedelta(seconds=90)).isoformat(),
        },
    )
    gang = _job(id=10, state="starting", queue={"position": None, "reason": "gang assembling 1/2"})
    unknown = _job(id=11, state="queued", queue={"position": 4, "reason": "budget exhausted"})
    text = _text(jobs_table([queued, gang, unknown, _job()], now=NOW))
    rows = {line.split()[0]: line.rstrip() for line in text.splitlines()[1:] if line.strip()}
    assert rows["9"].endswith("#3 quota gpus 2/2, starts in ~1m30s")
    assert rows["10"].endswith("  gang assembling 1/2")
    assert rows["11"].endswith("#4 budget exhausted")
    assert rows["7"].endswith(" -")
    assert queue_text(queued, now=NOW) == "#3 quota gpus 2/2, starts in ~1m30s"
    details = _text(job_details(queued))
    assert "queue" in details and "#3 quota gpus 2/2, starts in ~" in details
    assert "queue" not in _text(job_details(_job()))


def test_times_show_the_utc_moment_and_how_long_ago() -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    assert format_when(now - timedelta(minutes=3), now) == "2026-11-25 11:57:00 UTC (3m00s ago)"
    assert format_when(None, now) == "-"


def test_trained_says_the_span_from_start_to_end_when_it_is_longer() -> None:
    """Issue 28, item 8: "trained 3m38s" beside a 3m51s span, with no word on the difference."""
    from torchyard.render import trained_text

    start = NOW - timedelta(minutes=10)
    ended = _job(state="succeeded", started_at=start, finished_at=start + timedelta(seconds=231))
    assert trained_text(ended.model_copy(update={"running_s": 218.0})) == (
        "3m38s of 3m51s from start to end"
    )
    assert trained_text(ended.model_copy(update={"running_s": 230.8})) == "3m51s"
    assert trained_text(_job(running_s=42.0)) == "42s"  # still running: no end yet


def test_a_failures_hints_print_under_its_headline() -> None:
    failure = Failure.model_validate(
        {
            "failure_class": "user_error",
            "reason": "FileNotFoundError: /data/llama/config.json",
            "hints": ["`/data/llama` is not visible to the job: declare it in `entrypoint.inputs`"],
            "log_tail": ["Traceback"],
        }
    )
    lines = _text(failure_block(_job(state="failed", failure=failure))).splitlines()
    assert lines[1] == (
        "hint: `/data/llama` is not visible to the job: declare it in `entrypoint.inputs`"
    )
    assert lines[-1].strip() == "Traceback"
