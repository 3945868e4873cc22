"""Hosts as Linux network namespaces, for tests of a deployment whose hosts share only the
network, Postgres, Redis and object storage.

`Network` makes a switch: a namespace of its own holding a bridge with a /24 of its own
(10.200-249.x.0/24, one no route of this machine uses), and each `add_host` a namespace with a
veth pair to that bridge: the namespace's `eth0` gets `.2`, `.3`, ... and its own loopback.
Postgres, Redis and the S3 server (which listen on 127.0.0.1 only) are reached through TCP
proxies the test runs on the bridge's own address (`.1`): their listening sockets are made in
the switch's namespace, their upstream connections from the root one. `cut(host)` sets the
switch's end of a host's link down, as a pulled cable; `restore(host)` brings it back.
Everything the network made goes with its namespaces in `close()`, every `ip` command bounded in
time. Needs root (CI runs as root) and `ip` (iproute2).

The root namespace gains no interface and no address, and sees no link go down or up: a browser
of another test (Chromium) aborts its requests in flight with ERR_NETWORK_CHANGED when this
machine's addresses change, which a bridge in the root namespace did. Traffic stays on these
interfaces: a host's only route is its /24, so a process in it can reach the bridge's address
and the other hosts, nothing else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from tests.integration.faults.tcp_proxy import TcpProxy

IP_TIMEOUT_S = 10.0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`, bounded in time; raises CalledProcessError (with `check`)."""
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=check
    )


def available() -> str | None:
    """Why namespaces cannot be made here (None when they can): not root, or no `ip`."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2)"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no address or route of this machine overlaps."""
    used = []
    for line in (
        ip("-4", "route", "show", "table", "all").stdout.splitlines()
        + ip("-4", "-o", "addr").stdout.splitlines()
    ):
        for word in line.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(200, 249)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.version == 4 and u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.x.y.0/24")


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its address on the bridge, the root end of its link."""

    ns: str
    address: str
    link: str

    def argv(self, command: list[str]) -> list[str]:
        """`command` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *command]


class Network:
    """A bridge, its hosts and the proxies to the shared services (see the module)."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.gateway = str(addresses[0])
        self._next = iter(addresses[1:])
        self.bridge = f"tybr{self.tag}"
        self.switch = f"ty{self.tag}sw"
        self.hosts: list[Host] = []
        self.proxies: list[TcpProxy] = []
        ip("netns", "add", self.switch)
        try:
            sw = ("-n", self.switch)
            ip(*sw, "link", "add", self.bridge, "type", "bridge")
            ip(*sw, "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip(*sw, "link", "set", self.bridge, "up")
            ip(*sw, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def add_host(self) -> Host:
        n = len(self.hosts)
        host = Host(ns=f"ty{self.tag}h{n}", address=str(next(self._next)), link=f"ty{self.tag}v{n}")
        ip("netns", "add", host.ns)
        self.hosts.append(host)
        sw = ("-n", self.switch)  # both ends made where they live: nothing in the root namespace
        ip(*sw, "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        ip(*sw, "link", "set", host.link, "master", self.bridge, "up")
        ip("-n", host.ns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", host.ns, "link", "set", "eth0", "up")
        ip("-n", host.ns, "link", "set", "lo", "up")
        return host

    def expose(self, port: int) -> int:
        """Make 127.0.0.1:`port` (a service of this machine) reachable from the hosts at the
        bridge's address; returns the port there."""
        proxy = TcpProxy(("127.0.0.1", port), listen_host=self.gateway, namespace=self.switch)
        self.proxies.append(proxy)
        return proxy.port

    def cut(self, host: Host) -> None:
        """Pull `host`'s cable: its link's switch end goes down (its processes keep running)."""
        ip("-n", self.switch, "link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        ip("-n", self.switch, "link", "set", host.link, "up")

    def close(self) -> None:
        """Delete every namespace, with their links and the bridge (a namespace's processes
        must be gone first: the caller stops them)."""
        for proxy in self.proxies:
            proxy.close()
        for host in self.hosts:
            ip("netns", "del", host.ns, check=False)
        ip("netns", "del", self.switch, check=False)


def require_namespaces() -> None:
    """Skip the calling test where namespaces cannot be made (CI runs as root: never there)."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
