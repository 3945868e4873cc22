"""What the host must give the suite, and which modules need it (issue 44: a green suite means
everything ran).

Some modules test what only a real host can show: the job sandbox (bubblewrap and user
namespaces), cgroups, the network fence (nftables), several hosts (network namespaces), a
private Postgres (initdb), Slurm. A test of theirs used to skip where the host lacked it, and
the suite stayed green with the containment, multi-host and Slurm suites unrun. Now
`scripts/test.sh` checks the capabilities the selected modules need before pytest starts
(`python -m tests.support.capabilities [PYTEST ARGS]`), naming what is missing and how to
provide it, and the suite fails when any test skips (`TORCHYARD_TEST_NO_SKIPS=1`,
tests/conftest.py). Deselecting on purpose (`-m "not hosts"`, a path) is no skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _root() -> str | None:
    return None if os.geteuid() == 0 else "the suite runs as root (namespaces, mounts, cgroups)"


def _bwrap() -> str | None:
    from workers.isolation import sandbox

    return sandbox.probe()


def _cgroup() -> str | None:
    from workers.isolation import cgroups

    made = cgroups.create(f"capability-probe-{os.getpid()}", memory_bytes=None, cpus=None)
    if made is None:
        return "no writable cgroup hierarchy (v1 memory+cpu, or v2 with delegation)"
    made.remove()
    return None


def _tool(*names: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        missing = [n for n in names if shutil.which(n) is None]
        return f"not installed: {', '.join(missing)}" if missing else None

    return probe


def _initdb() -> str | None:
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return None if bins else "no Postgres initdb under /usr/lib/postgresql/*/bin"


def _slurm() -> str | None:
    if shutil.which("sinfo") is not None:
        try:
            done = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            return None
    return "no Slurm cluster answers `sinfo`"


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    probe: Callable[[], str | None]  # None when the host has it, else why not
    how: str  # how to provide it


CAPABILITIES = {
    c.name: c
    for c in (
        Capability("root", _root, "run the suite as root (CI does: `.ci/run`)"),
        Capability(
            "bwrap",
            _bwrap,
            "apt-get install bubblewrap, and allow unprivileged user namespaces "
            "(kernel.unprivileged_userns_clone=1) or run as root",
        ),
        Capability("cgroup", _cgroup, "a writable /sys/fs/cgroup (root, outside a container)"),
        Capability("nft", _tool("nft"), "apt-get install nftables"),
        Capability("ip", _tool("ip"), "apt-get install iproute2"),
        Capability("mount", _tool("mount", "runuser"), "apt-get install mount util-linux"),
        Capability("initdb", _initdb, "apt-get install postgresql"),
        Capability("slurm", _slurm, "bash scripts/slurm.sh (as root)"),
        Capability("nsenter", _tool("nsenter", "slurmctld"), "bash scripts/slurm.sh (as root)"),
    )
}

# Module (or folder) -> the capabilities its tests need. Every `skip` a test of the suite may
# take is gated here, so none is left to run-time luck.
GATED: dict[str, tuple[str, ...]] = {
    "tests/integration/workers/": ("bwrap",),  # every worker sandboxes (tests/conftest.py)
    "tests/integration/workers/test_sandbox.py": ("bwrap", "root", "nft", "cgroup"),
    "tests/integration/workers/test_cgroups.py": ("cgroup",),
    "tests/integration/workers/test_slurm.py": ("bwrap", "slurm", "cgroup"),
    "tests/integration/faults/": ("bwrap",),
    "tests/integration/faults/test_postgres_restart.py": ("root", "initdb", "mount"),
    "tests/integration/faults/test_failure_classes.py": ("root", "mount", "cgroup"),
    "tests/integration/hosts/": ("root", "ip", "bwrap"),
    "tests/integration/hosts/test_slurm_hosts.py": ("root", "ip", "slurm", "nsenter"),
    "tests/integration/storage/": ("bwrap",),
    "tests/e2e/": ("bwrap",),
}


def needed(paths: Sequence[str]) -> dict[str, list[str]]:
    """{capability: [the gated modules that need it]} for a run of `paths` (pytest's
    positional arguments, relative to the repository; none: the whole suite)."""
    wanted = [p.split("::")[0].rstrip("/") for p in paths] or ["tests"]
    found: dict[str, list[str]] = {}
    for gated, names in GATED.items():
        gated_path = gated.rstrip("/")
        if not any(
            gated_path == w or gated_path.startswith(w + "/") or w.startswith(gated_path + "/")
            for w in wanted
        ):
            continue
        for name in names:
            found.setdefault(name, []).append(gated)
    return found


def missing(paths: Sequence[str]) -> list[str]:
    """One line per capability the run of `paths` needs and this host lacks: what, why, which
    modules, and how to provide it."""
    lines = []
    for name, modules in sorted(needed(paths).items()):
        capability = CAPABILITIES[name]
        why = capability.probe()
        if why is not None:
            shown = ", ".join(sorted(set(modules)))
            lines.append(f"{name}: {why} (needed by {shown}); {capability.how}")
    return lines


def _paths(argv: Sequence[str]) -> list[str]:
    """pytest's positional arguments that name tests (`tests/...`), options and their values
    left out."""
    return [a for a in argv if not a.startswith("-") and a.split("::")[0].startswith("tests")]


def main(argv: Sequence[str]) -> int:
    """0 when the host has what the run of `argv` (pytest's arguments) needs; else 3, with a
    line per missing capability on stderr. A run that selects by marker or keyword (`-m`,
    `-k`) is not checked here: what it selects is known only once collected, and a test of it
    that skips still fails the run."""
    if any(a in ("-m", "-k") or a.startswith(("-m", "-k")) for a in argv):
        return 0
    lines = missing(_paths(argv))
    if not lines:
        return 0
    print("The suite cannot run everything it selected on this host:", file=sys.stderr)
    for line in lines:
        print(f"  - {line}", file=sys.stderr)
    print(
        "Provide them, or deselect those tests on purpose (e.g. `-m 'not hosts'`, or name "
        "other paths): a test that would skip fails the run (TORCHYARD_TEST_NO_SKIPS=1).",
        file=sys.stderr,
    )
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
