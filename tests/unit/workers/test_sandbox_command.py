"""The sandbox's bwrap command (`workers.isolation.sandbox.argv`), its exit statuses, and a job
cgroup's limits (`workers.isolation.cgroups.lease_limits`): the pure parts; the sandbox and the
cgroups themselves are tested on a real worker (tests/integration/workers/test_sandbox.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers import exits
from workers.isolation import cgroups, sandbox


def _pairs(argv: list[str], flag: str) -> list[str]:
    """The first argument of every `flag` in `argv`."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_job_sees_its_own_directories_and_the_hidden_ones_are_masked(tmp_path: Path) -> None:
    source = tmp_path / "src"
    home, venvs = source / ".torchyard", source / ".torchyard" / "venvs"
    venv = venvs / "abc"
    run, data, absent = home / "runs" / "1", tmp_path / "data", tmp_path / "absent"
    for d in (venv, run, data):
        d.mkdir(parents=True)
    mounts = sandbox.Mounts(
        read_only=(str(data), str(absent)),
        writable=(str(run),),
        hidden=(str(home), str(venvs)),
        network=False,
        python=(str(source), str(venv)),
    )
    argv = sandbox.argv(mounts, ["torchrun", "x"], cwd=run, info_fd=9)
    # The command starts with the stop signals' default dispositions (bwrap ignores them).
    assert argv[-5:] == ["--", "env", "--default-signal=HUP,INT,TERM", "torchrun", "x"]
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net"):
        assert flag in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"] and _pairs(argv, "--info-fd") == ["9"]
    # The source tree read-only, the home masked, the job's venv bound back over the mask.
    ro = _pairs(argv, "--ro-bind")
    assert str(source) in ro and str(venv) in ro and str(data) in ro and str(absent) not in ro
    assert str(home) in _pairs(argv, "--tmpfs")
    assert ro.index(str(venv)) > ro.index(str(source))
    assert argv.index(str(home)) < len(argv) - argv[::-1].index(str(venv))
    assert _pairs(argv, "--bind") == [str(run)] and _pairs(argv, "--chdir") == [str(run)]
    # /tmp is private and made before anything that may lie under it is bound.
    assert argv.index("/tmp") < argv.index(str(run))
    assert "/etc/shadow" not in argv and "/etc/passwd" in _pairs(argv, "--ro-bind-try")


def test_declared_inputs_are_bound_read_only_at_their_names_after_everything_else(
    tmp_path: Path,
) -> None:
    """`/inputs/<name>` binds the input's real path (a symlink followed), read-only, after the
    writable binds, so no later mount covers it; the host path itself is not shown."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(corpus)
    run = tmp_path / "run"
    run.mkdir()
    mounts = sandbox.Mounts(
        writable=(str(run),),
        placed=((str(link), "/inputs/corpus"), (str(tmp_path), "/inputs/dir")),
        network=False,
        python=(),
    )
    argv = sandbox.argv(mounts, ["x"], cwd=None, info_fd=3)
    binds = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--ro-bind"]
    assert (str(corpus), "/inputs/corpus") in binds and (str(tmp_path), "/inputs/dir") in binds
    assert argv.index("/inputs/corpus") > argv.index("--bind")
    assert str(link) not in argv


def test_shows_tells_which_host_paths_the_sandbox_shows_where_they_lie(tmp_path: Path) -> None:
    """`shows` follows `argv`: the job's own and read-only paths, its Pythons (not the hidden
    home beneath them, but a venv bound back), the system and allowed `/etc` files; nothing of
    the host's `/tmp`, nor a declared input's host path (it lies at `/inputs/<name>`)."""
    source = tmp_path / "src"
    home, data, run = source / ".torchyard", tmp_path / "data", tmp_path / "run"
    venv = home / "venvs" / "abc"
    model = tmp_path / "models" / "llama"
    for d in (venv, data, run, model):
        d.mkdir(parents=True)
    mounts = sandbox.Mounts(
        read_only=(str(data),),
        writable=(str(run),),
        placed=((str(model), "/inputs/model"),),
        hidden=(str(home),),
        python=(str(source), str(venv)),
    )
    for shown in (data / "x", run, source / "pkg.py", venv / "bin", "/usr/lib", "/etc/passwd"):
        assert sandbox.shows(mounts, str(shown)), shown
    for hidden in (home / "secret", model, tmp_path, "/etc/shadow", "/root", "/tmp/x"):
        assert not sandbox.shows(mounts, str(hidden)), hidden


def test_a_job_that_needs_the_network_shares_it_and_sees_only_its_leased_gpus() -> None:
    mounts = sandbox.Mounts(network=True, devices=sandbox.nvidia_devices((2,)), python=())
    argv = sandbox.argv(mounts, ["x"], cwd=None, info_fd=3)
    assert "--unshare-net" not in argv
    assert _pairs(argv, "--dev-bind-try")[:2] == ["/dev/nvidia2", "/dev/nvidiactl"]
    assert "/dev/nvidia0" not in argv
    assert sandbox.nvidia_devices(None) == ()


def test_the_python_paths_hold_the_interpreters_and_never_the_root() -> None:
    paths = sandbox.python_paths([sys.executable])
    assert "/" not in paths
    assert any(Path(sys.executable).resolve().is_relative_to(p) for p in paths)


@pytest.mark.parametrize(("status", "code"), [(0, 0), (1, 1), (137, -9), (143, -15), (255, 255)])
def test_bwraps_status_reads_as_popens(status: int, code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({status})"])
    wrapped = sandbox.SandboxedProcess(proc, proc.pid, proc.pid)
    assert wrapped.wait() == code and wrapped.returncode == code


def test_a_lease_gets_its_slots_memory_and_its_share_of_the_cores() -> None:
    gib = 2**30
    limits = cgroups.lease_limits
    assert limits(
        leased=1, host_slots=4, slot_memory_mb=None, total_memory=16 * gib, cpu_count=8
    ) == (4 * gib, 2.0)
    assert limits(
        leased=2, host_slots=4, slot_memory_mb=1024, total_memory=16 * gib, cpu_count=2
    ) == (2 * gib, 1.0)
    assert limits(leased=0, host_slots=0, slot_memory_mb=None, total_memory=gib, cpu_count=2) == (
        None,
        None,
    )


def test_a_nodes_oom_kills_are_its_groups_and_the_workers(tmp_path: Path) -> None:
    group = cgroups.JobCgroup(dirs=[tmp_path], version=1)
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.oom_kills() == 2
    counter = exits.oom_counter(group)
    worker = exits.oom_kills()
    assert counter() == 2 + (worker or 0)
    assert exits.oom_counter(None) is exits.oom_kills
