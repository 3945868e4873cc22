"""Where webhooks may go: SSRF checks on a destination URL, at subscription and at delivery.

A destination's host is resolved and every address it resolves to must be public: private,
loopback, link-local (169.254.0.0/16, the cloud metadata address), multicast, reserved,
unspecified and shared (100.64.0.0/10) addresses are refused unless `webhook_allow`
(`TORCHYARD_WEBHOOK_ALLOW`: CIDRs or host names) permits them. Delivery connects to the
address checked here (`Target.address`), so a DNS answer that changes between the check and
the connection cannot redirect a delivery inside the network.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from core.platform.errors import InvalidInput

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedDestination(Exception):
    """A destination that is not allowed (or cannot be resolved); the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked destination: `url` as given, `host` its host name, `address` the IP to use."""

    url: str
    host: str
    port: int
    address: str


def _public(ip: IpAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def _allowed(ip: IpAddress, allow: Sequence[str]) -> bool:
    for entry in allow:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue  # a host name entry
        if ip.version == network.version and ip in network:
            return True
    return False


def _resolve(host: str, port: int) -> list[IpAddress]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise RefusedDestination(f"cannot resolve {host!r}: {exc}") from exc
    # scope ids ("fe80::1%eth0") are dropped: a link-local address is refused anyway
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def check(url: str, *, allow: Sequence[str]) -> Target:
    """Resolve `url`'s host and check every address; the first is the one to connect to.

    Raises RefusedDestination for a URL that is not `http(s)://host[:port]/...`, a host that
    does not resolve, or one with an address that is not public and not in `allow`.
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # "http://[::1", "http://h:99999"
        raise RefusedDestination(f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise RefusedDestination("the URL must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise RefusedDestination("the URL must not carry credentials")
    port = port or (443 if parts.scheme == "https" else 80)
    host = host.lower()
    addresses = _resolve(host, port)
    if not addresses:
        raise RefusedDestination(f"{host!r} resolves to no address")
    names = {entry.lower() for entry in allow}
    if host not in names:
        for ip in addresses:
            if not (_public(ip) or _allowed(ip, allow)):
                raise RefusedDestination(
                    f"{host!r} resolves to {ip}, a private, loopback, link-local or reserved "
                    "address (allow it with TORCHYARD_WEBHOOK_ALLOW)"
                )
    return Target(url=url, host=host, port=port, address=str(addresses[0]))


def check_or_invalid(url: str, *, allow: Sequence[str]) -> Target:
    """`check`, raising InvalidInput (422) at `body.url` instead of RefusedDestination."""
    try:
        return check(url, allow=allow)
    except RefusedDestination as exc:
        raise InvalidInput(
            f"webhook url refused: {exc}",
            details=[{"loc": ["body", "url"], "msg": str(exc), "type": "ssrf_refused"}],
        ) from exc
