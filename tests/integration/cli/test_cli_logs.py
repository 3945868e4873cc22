"""`torchyard logs` against a real API: --rank, --grep, --since, --follow over the job's live
stream, and one rank prefix per line (issue 15)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from typer.testing import Result

from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.tables import LogLine, utcnow

OLD = timedelta(hours=3)


@pytest.fixture
def job_with_logs(cli: Any, spec_file: Path, engine: Engine) -> int:
    """A queued job with lines of two ranks and the launcher, some three hours old; the
    trainer's own `[rank0]` prefix is in the stored text as a real trainer writes it."""
    job_id = int(json.loads(cli("submit", str(spec_file), "--json").stdout)["id"])
    now = utcnow()
    rows = [
        (0, "[rank0] 2026-11-25 INFO trainer: step 10 loss 3.2", now - OLD),
        (1, "[rank1] 2026-11-25 INFO trainer: step 10 loss 3.3", now - OLD),
        (0, "[rank0] 2026-11-25 INFO trainer: step 20 loss 2.9", now),
        (1, "RuntimeError: boom", now),
        (-1, "torchrun exited 0", now),
    ]
    with session_scope(engine) as s:
        for offset, (rank, line, at) in enumerate(rows):
            s.add(
                LogLine(
                    job_id=job_id,
                    attempt=1,
                    rank=rank,
                    stream="stdout",
                    offset=offset,
                    line=line,
                    created_at=at,
                )
            )
    return job_id


def _lines(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_logs_print_one_rank_prefix_per_line(cli: Any, job_with_logs: int) -> None:
    assert _lines(cli("logs", str(job_with_logs))) == [
        "[rank 0] 2026-11-25 INFO trainer: step 10 loss 3.2",
        "[rank 1] 2026-11-25 INFO trainer: step 10 loss 3.3",
        "[rank 0] 2026-11-25 INFO trainer: step 20 loss 2.9",
        "[rank 1] RuntimeError: boom",
        "[launcher] torchrun exited 0",
    ]


def test_logs_filter_by_rank_regex_and_age(cli: Any, job_with_logs: int) -> None:
    job = str(job_with_logs)
    assert _lines(cli("logs", job, "--rank", "0", "--grep", r"loss \d")) == [
        "[rank 0] 2026-11-25 INFO trainer: step 10 loss 3.2",
        "[rank 0] 2026-11-25 INFO trainer: step 20 loss 2.9",
    ]
    assert _lines(cli("logs", job, "--since", "1h", "--grep", "Error|loss")) == [
        "[rank 0] 2026-11-25 INFO trainer: step 20 loss 2.9",
        "[rank 1] RuntimeError: boom",
    ]
    bad = cli("logs", job, "--since", "yesterday")
    assert bad.exit_code == 2 and "90s, 10m, 2h, 1d" in bad.output
    assert cli("logs", job, "--grep", "(").exit_code == 2


def test_logs_follow_reads_the_stream_until_the_job_ends(
    cli: Any,
    job_with_logs: int,
    engine: Engine,
) -> None:
    with session_scope(engine) as s:
        jobs.cancel(session=s, job_id=job_with_logs)
    followed = _lines(cli("logs", str(job_with_logs), "--follow", "--rank", "1"))
    assert followed == [
        "[rank 1] 2026-11-25 INFO trainer: step 10 loss 3.3",
        "[rank 1] RuntimeError: boom",
    ]
