"""Issue 13's new user, for real: in their copy of `examples/ddp`, `torchyard submit --code .
spec.yaml --follow` against a real API and worker exits 0 once the job succeeds and prints its
loss, and the dashboard's page of that job charts every step's loss."""

from __future__ import annotations

import contextlib
import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Browser, expect
from typer.testing import CliRunner

from tests.conftest import REPO_ROOT, ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash
from tests.integration.workers.helpers import Worker
from torchyard.cli import app

STEPS = 40
POINTS = "id => document.getElementById(id)?.data?.[0]?.x?.length ?? 0"


@pytest.fixture
def laptop(browser: Browser, live_api: str, owner: ProjectKey) -> Iterator[Dash]:
    with new_dash(browser, live_api, owner.api_key, "light", LAPTOP) as dash:
        yield dash


def _my_copy_of_the_ddp_example(tmp_path: Path, pool: str) -> Path:
    """`examples/ddp` copied, its spec.yaml shortened to STEPS steps on `pool`."""
    code = tmp_path / "my_ddp"
    shutil.copytree(REPO_ROOT / "examples" / "ddp", code)
    spec = yaml.safe_load((code / "spec.yaml").read_text())
    spec["entrypoint"]["command"] = ["python", "train.py", "--max-steps", str(STEPS)]
    spec["resources"]["pool"] = pool
    (code / "spec.yaml").write_text(yaml.safe_dump(spec))
    return code


def test_submit_code_follow_runs_the_ddp_example_and_its_page_charts_the_loss(
    live_api: str, owner: ProjectKey, worker: Worker, laptop: Dash, tmp_path: Path
) -> None:
    code = _my_copy_of_the_ddp_example(tmp_path, worker.queue)
    env = {
        "TORCHYARD_URL": live_api,
        "TORCHYARD_API_KEY": owner.api_key,
        "TORCHYARD_CONFIG": str(tmp_path / "no-config.toml"),
        "COLUMNS": "160",
    }
    with contextlib.chdir(code):
        result = CliRunner().invoke(
            app, ["submit", "--code", ".", "spec.yaml", "--follow", "--poll", "0.5"], env=env
        )
    assert result.exit_code == 0, result.output
    assert "running -> succeeded" in result.output, result.output
    final = re.search(r"^loss\s+(\d+\.\d+)\s*$", result.output, re.MULTILINE)
    assert final, result.output
    assert 0 < float(final[1]) < math.log(256), "it learned: below a uniform guess of the byte"
    submitted = re.search(r"submitted job (\d+)", result.output)
    assert submitted, result.output

    page = laptop.page
    laptop.open(f"/jobs/{submitted[1]}")
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#chart-loss")).to_be_visible()
    page.wait_for_function(f"({POINTS})('chart-loss') === {STEPS}")
    laptop.shot("example-ddp-job")
