"""The suite's own tools (issue 44): which capabilities a selection of tests needs
(`tests.support.capabilities`), the flake ledger's count (`tests.support.flakes`), and the
order modules go out to the workers in (`tests.conftest.longest_modules_first`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import MODULE_SECONDS, longest_modules_first
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


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_longest_modules_go_first_each_kept_whole_in_its_shuffled_order() -> None:
    seconds = json.loads(MODULE_SECONDS.read_text())
    slow, fast = max(seconds, key=seconds.get), min(seconds, key=seconds.get)
    shuffled = [f"{fast}::b", f"{slow}::z", f"{fast}::a", f"{slow}::y", "tests/new.py::x"]
    items = [_Item(n) for n in shuffled]
    longest_modules_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/new.py::x",  # unknown: as if the longest
        f"{slow}::z",
        f"{slow}::y",  # the shuffle inside a module stays
        f"{fast}::b",
        f"{fast}::a",
    ]
    assert seconds[slow] > 60 * seconds[fast]
