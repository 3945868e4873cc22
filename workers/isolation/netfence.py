"""The network fence: a job whose ranks keep the host's network (several nodes, storage in an
object store, a model from the hub) cannot open connections to the control plane.

A single node on local storage needs no fence: its sandbox has no network at all
(`workers.isolation.sandbox`, `--unshare-net`). The others share the host's network namespace, where
the worker's database and broker listen (or are reached). The worker installs one nftables table in
that namespace when it starts, `inet torchyard_<worker>`, whose `output` chain rejects, for
every socket of a process in its jobs' cgroups (`socket cgroupv2 level N "<path>"`: the v2
group that holds every node group of this worker, `workers.isolation.cgroups.fence_parent`):

- TCP to each address of the database and the broker (`TORCHYARD_DATABASE_URL`,
  `TORCHYARD_BROKER_URL`, their host names resolved when the worker starts) at their ports,
  and to those of `TORCHYARD_FENCED_DESTINATIONS` (e.g. the API's admin listener, the object
  store's console);
- everything to the link-local ranges, where clouds serve instance metadata and credentials
  (169.254.0.0/16, fe80::/10, and AWS's fd00:ec2::254).

Everything else passes: the job's own rendezvous and gloo/NCCL traffic to the other nodes, the
object store's data endpoint, the hub. The worker's own sockets are in its own cgroup, not
matched. The table is replaced when a worker of the same name starts and deleted when it stops.

Needs root (CAP_NET_ADMIN) in the worker's network namespace, the `nft` command (Debian's
`nftables`) and cgroup v2 (pure, or the hybrid layout's `/sys/fs/cgroup/unified`). Where one is
missing the worker runs unfenced and says so (`GET /v1/workers`: `sandbox`).

Source: nftables wiki, "Matching packets by socket cgroup" (`socket cgroupv2`, kernel >= 5.13
for the level match; nftables >= 1.0).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from core.platform.settings import Settings
from workers.isolation import cgroups

log = logging.getLogger(__name__)

#: where clouds answer metadata and credential requests: always fenced
LINK_LOCAL = ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254")
DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "redis": 6379, "rediss": 6379,
                 "amqp": 5672, "amqps": 5671}  # fmt: skip
NFT_TIMEOUT_S = 10


@dataclass(frozen=True)
class Target:
    """A fenced TCP destination: an address (v4 or v6) and a port."""

    address: str
    port: int


@dataclass(frozen=True)
class Fence:
    """An installed fence: its nftables table; `remove()` deletes it."""

    table: str
    targets: tuple[Target, ...]

    def remove(self) -> None:
        """Delete the table (nothing when it is gone already)."""
        _nft(f"delete table inet {self.table}\n", check=False)


def targets(settings: Settings, extra: list[str] | None = None) -> list[Target]:
    """The control plane's TCP destinations: the database's (PgBouncer's and Postgres' own when
    both are set) and the broker's (a SQLite file or
    the filesystem broker have none) and each `host:port` of `extra` (`[v6]:port` for an IPv6
    literal), every host name resolved to all its addresses. Unresolvable names are logged and
    left out (the worker could not reach them either). Raises ValueError for an `extra` entry
    without a port."""
    found: list[Target] = []
    for url in (settings.database_url, settings.direct_database_url, settings.broker_url):
        parts = urlsplit(url)
        scheme = parts.scheme.split("+", 1)[0]
        if scheme in DEFAULT_PORTS and parts.hostname:
            found += _resolved(parts.hostname, parts.port or DEFAULT_PORTS[scheme])
    for entry in extra or []:
        parts = urlsplit(f"//{entry}")
        if not parts.hostname or parts.port is None:
            raise ValueError(f"fenced destination {entry!r} is not host:port")
        found += _resolved(parts.hostname, parts.port)
    return sorted(set(found), key=lambda t: (t.address, t.port))


def _resolved(host: str, port: int) -> list[Target]:
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        log.warning("network fence: %s does not resolve (%s); not fenced", host, exc)
        return []
    return [Target(str(info[4][0]), port) for info in infos]


def table_name(worker: str) -> str:
    """The worker's table: `torchyard_` and a digest of its name (nft names are short)."""
    return f"torchyard_{hashlib.sha256(worker.encode()).hexdigest()[:12]}"


def ruleset(table: str, level: int, group: str, fenced: list[Target]) -> str:
    """The nft script that (re)creates `table`: in its `output` chain, sockets of processes
    under the v2 group `group` (a path below `/sys/fs/cgroup`, at depth `level` of the v2
    hierarchy) are rejected to `fenced` and to the link-local ranges."""
    match = f'socket cgroupv2 level {level} "{group}"'
    lines = [
        f"table inet {table} {{}}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
    ]
    for target in fenced:
        family = "ip6" if ipaddress.ip_address(target.address).version == 6 else "ip"
        lines.append(
            f"    {match} {family} daddr {target.address} tcp dport {target.port} "
            "reject with tcp reset"
        )
    for net in LINK_LOCAL:
        family = "ip6" if ipaddress.ip_network(net).version == 6 else "ip"
        lines.append(f"    {match} {family} daddr {net} reject")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def install(settings: Settings, worker: str, extra: list[str] | None = None) -> Fence | str:
    """Install this worker's fence; the `Fence`, or why there is none (a sentence)."""
    table = table_name(worker)
    cgroups.set_scope(table)  # its jobs' groups, apart from other workers' on this host
    if shutil.which("nft") is None:
        return "nft not installed (Debian: nftables)"
    try:
        parent = cgroups.fence_parent()
    except OSError as exc:
        return f"no cgroup v2 group for jobs: {exc}"
    if parent is None:
        return "no cgroup v2 hierarchy for jobs"
    base, level = parent
    fenced = targets(settings, extra)
    group = str(base.relative_to(cgroups.ROOT))
    done = _nft(ruleset(table, level, group, fenced), check=False)
    if done.returncode != 0:
        return f"nft refused the rules: {done.stderr.strip()[:300]}"
    log.info(
        "network fence %s: jobs under %s cannot reach %s or link-local addresses",
        table, Path(base), ", ".join(f"{t.address}:{t.port}" for t in fenced) or "nothing else",
    )  # fmt: skip
    return Fence(table, tuple(fenced))


def _nft(script: str, *, check: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nft", "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        check=check,
        timeout=NFT_TIMEOUT_S,
    )
