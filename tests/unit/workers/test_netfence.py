"""`workers.isolation.netfence`: which destinations a worker fences off its jobs, and the nftables
script that does it (the rules in force: tests/integration/workers/test_sandbox.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.platform.settings import Settings
from workers.isolation.netfence import Target, ruleset, table_name, targets


def _settings(tmp_path: Path, database_url: str, broker_url: str) -> Settings:
    return Settings(home=tmp_path, database_url=database_url, broker_url=broker_url)


def test_the_database_and_the_broker_are_fenced_at_their_ports_with_the_defaults(
    tmp_path: Path,
) -> None:
    settings = _settings(
        tmp_path,
        "postgresql+psycopg://ty:secret@127.0.0.1/torchyard",  # no port: 5432
        "redis://127.0.0.1:6380/3",
    )
    assert targets(settings, ["[::1]:8001", "10.1.2.3:9001"]) == [
        Target("10.1.2.3", 9001), Target("127.0.0.1", 5432), Target("127.0.0.1", 6380),
        Target("::1", 8001),
    ]  # fmt: skip
    # a name is fenced at every address it resolves to (this host: at least 127.0.0.1)
    assert Target("127.0.0.1", 9001) in targets(settings, ["localhost:9001"])


def test_behind_pgbouncer_both_pgbouncer_and_postgres_itself_are_fenced(tmp_path: Path) -> None:
    """A job must reach neither the pooler the worker uses nor the Postgres behind it (the
    controller's `direct_database_url`); without a direct URL, Postgres is `database_url`, and a
    copy with another `database_url` follows it."""
    settings = Settings(
        home=tmp_path,
        database_url="postgresql+psycopg://ty@127.0.0.1:6432/torchyard",
        database_direct_url="postgresql+psycopg://ty@127.0.0.1:5432/torchyard",
        broker_url="redis://127.0.0.1:6379/0",
    )
    assert targets(settings) == [
        Target("127.0.0.1", 5432), Target("127.0.0.1", 6379), Target("127.0.0.1", 6432),
    ]  # fmt: skip
    plain = _settings(tmp_path, "postgresql+psycopg://ty@127.0.0.1:5433/a", "redis://127.0.0.1")
    assert plain.direct_database_url == plain.database_url
    moved = plain.model_copy(update={"database_url": "postgresql+psycopg://ty@127.0.0.1:5434/b"})
    assert moved.direct_database_url.endswith(":5434/b")


def test_the_embedded_default_has_nothing_to_fence_but_link_local(tmp_path: Path) -> None:
    settings = _settings(tmp_path, f"sqlite:///{tmp_path / 'ty.db'}", "filesystem://")
    assert targets(settings) == []
    script = ruleset("torchyard_x", 1, "unified/torchyard", [])
    assert script.count("reject") == 3  # 169.254.0.0/16, fe80::/10, fd00:ec2::254


def test_a_destination_without_a_port_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path, f"sqlite:///{tmp_path / 'ty.db'}", "filesystem://")
    with pytest.raises(ValueError, match="not host:port"):
        targets(settings, ["api.internal"])


def test_the_script_replaces_the_table_and_matches_the_jobs_cgroup_only() -> None:
    script = ruleset(
        "torchyard_ab12", 3, "system.slice/ty.service/torchyard",
        [Target("10.0.0.5", 5432), Target("fd00::7", 6379)],
    )  # fmt: skip
    lines = [line.strip() for line in script.splitlines()]
    # created empty, deleted, made again: one transaction replaces a table of the same name
    table = "table inet torchyard_ab12"
    assert lines[:3] == [f"{table} {{}}", "delete " + table, f"{table} {{"]
    match = 'socket cgroupv2 level 3 "system.slice/ty.service/torchyard"'
    assert f"{match} ip daddr 10.0.0.5 tcp dport 5432 reject with tcp reset" in lines
    assert f"{match} ip6 daddr fd00::7 tcp dport 6379 reject with tcp reset" in lines
    assert f"{match} ip daddr 169.254.0.0/16 reject" in lines
    rules = [line for line in lines if "reject" in line]
    assert all(line.startswith(match) for line in rules)  # never the worker's own sockets


def test_each_worker_has_a_table_of_its_own_with_a_short_name() -> None:
    a, b = table_name("w-1@gpu-host-a"), table_name("w-1@gpu-host-b")
    assert a != b and a == table_name("w-1@gpu-host-a")
    assert len(a) <= 32 and a.startswith("torchyard_")
