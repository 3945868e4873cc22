"""The suite's own tools (issue 44): which capabilities a selection of tests needs
(`tests.support.capabilities`), and the flake ledger's count (`tests.support.flakes`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import capabilities

ROOT = Path(__file__).resolve().parents[3]


def test_a_selection_needs_the_capabilities_of_the_gated_modules_it_holds() -> None:
    assert capabilities.needed(["tests/unit"]) == {}
    whole = capabilities.needed([])
    assert {"root", "bwrap", "cgroup", "nft", "ip", "initdb", "slurm"} <= set(whole)
    hosts = capabilities.needed(["tests/integration/hosts/test_link_cut.py::test_x"])
    assert set(hosts) == {"root", "ip", "bwrap"}
    # A folder holding gated modules needs what they need.
    assert "slurm" in capabilities.needed(["tests/integration"])
    assert set(capabilities.needed(["tests/integration/api"])) == set()


def test_every_gated_module_exists_and_every_capability_is_known() -> None:
    for gated, names in capabilities.GATED.items():
        assert (ROOT / gated).exists(), gated
        assert set(names) <= set(capabilities.CAPABILITIES), names


def test_a_selection_by_marker_is_checked_once_collected_not_before() -> None:
    assert capabilities.main(["-m", "not hosts"]) == 0


def test_the_flake_ledger_counts_the_runs_that_failed(tmp_path: Path) -> None:
    module = tmp_path / "test_sometimes.py"
    module.write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert False\n")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.flakes", "--repeat", "2", str(module)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"{module}: 0/2 passed" in done.stdout
    assert "failed with seeds [" in done.stdout
