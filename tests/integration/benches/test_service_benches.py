"""The service benches' smoke modes (`tests.integration.benches.smoke`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.benches.smoke import GROUPS, SMOKE_TIMEOUT_S, run_smoke


@pytest.mark.timeout(SMOKE_TIMEOUT_S)
@pytest.mark.parametrize("name", GROUPS["service"])
def test_bench_smoke_mode_runs_its_whole_path_and_prints_its_figures(
    name: str, redis_url: str, tmp_path: Path
) -> None:
    run_smoke(name, redis_url, tmp_path)
