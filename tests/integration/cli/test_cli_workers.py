"""``torchyard workers`` and ``client.workers`` against a real API server (issue 32: `GET
/v1/workers` had no CLI, SDK or page view): which workers serve which pools, with how many
free slots, alive or gone, and whether they sandbox their jobs."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete

from core.platform.db import session_scope
from core.platform.tables import Worker, utcnow
from tests.integration.conftest import cli_invoker
from torchyard import Client


@pytest.fixture
def two_workers(engine: Engine) -> Iterator[tuple[str, str]]:
    """A live sandboxed worker and one whose heartbeat stopped an hour ago, unsandboxed."""
    live, gone = (f"w-{secrets.token_hex(3)}@host-{i}" for i in range(2))
    now = utcnow()
    common = {"pid": 1, "started_at": now - timedelta(hours=2)}
    with session_scope(engine) as s:
        s.add(
            Worker(
                name=live,
                pool="gpu-a,gpu-b",
                host="host-0",
                heartbeat_at=now,
                slots_total=8,
                slots_free=3,
                sandbox="bwrap",
                **common,
            )
        )
        s.add(Worker(name=gone, pool="cpu", host="host-1", heartbeat_at=now - timedelta(hours=1),
                     slots_total=2, slots_free=None, sandbox="none: TORCHYARD_SANDBOX=none",
                     **common))  # fmt: skip
    yield live, gone
    with session_scope(engine) as s:
        s.execute(delete(Worker).where(Worker.name.in_([live, gone])))


def test_workers_lists_pools_slots_state_and_sandbox(
    live_api: str, api_key: str, two_workers: tuple[str, str], tmp_path: Path
) -> None:
    live, gone = two_workers
    cli = cli_invoker(live_api, api_key, tmp_path)
    # The list is the whole fleet's (the suite's other workers too), so which columns fit at 80
    # depends on their pools' widths (tests/unit/torchyard/test_client_tables.py holds the
    # table at 80 and 200 columns): the fields are read from the same command's JSON.
    listed = {w["name"]: w for w in json.loads(cli("workers", "--json").stdout)}
    fields = ("pool", "host", "slots_free", "slots_total", "alive", "sandbox")
    assert [listed[live][f] for f in fields] == ["gpu-a,gpu-b", "host-0", 3, 8, True, "bwrap"]
    assert (listed[live]["alive"], listed[gone]["alive"]) == (True, False)
    # 80 columns: slots and state never dropped; each sandbox whole on its own line under its
    # worker's row, never cut (the host, the first column to go, may be dropped)
    result = cli("workers")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    ours = next(i for i, line in enumerate(lines) if line.startswith(live))
    theirs = next(i for i, line in enumerate(lines) if line.startswith(gone))
    assert {"3/8", "alive"} <= set(lines[ours].split()), result.stdout
    assert {"?/2", "gone"} <= set(lines[theirs].split()), result.stdout
    assert lines[ours + 1].strip() == "bwrap", result.stdout
    assert lines[theirs + 1].strip() == "none: TORCHYARD_SANDBOX=none", result.stdout

    with Client(live_api, api_key) as client:
        workers = {w.name: w for w in client.workers.list()}
    assert workers[live].slots_free == 3 and workers[gone].slots_free is None
    assert workers[gone].sandbox == "none: TORCHYARD_SANDBOX=none"
