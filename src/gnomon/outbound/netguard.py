"""Which network addresses an outbound callback may reach (the SSRF guard).

A tenant chooses the callback URL, and the worker runs inside the operator's network,
so without a guard a job could make the worker call its loopback services, the private
network or the cloud metadata endpoint and log the answer. The guard resolves the host
once, checks every address it resolved to, and returns one checked address that the
caller must connect to: checking one resolution and connecting with another would let a
DNS rebind swap the address in between.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gnomon.core.errors import GnomonError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[[str, int], Sequence[str]]
"""``(host, port) -> addresses as text``; injectable so tests can point a name anywhere."""

CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
METADATA_ADDRESSES = frozenset({
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, ...
    ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
    ipaddress.ip_address("fd00:ec2::254"),  # AWS IMDS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
})
LINK_LOCAL_V4 = ipaddress.IPv4Network("169.254.0.0/16")  # all of it: clouds put more services there


class TargetRefused(GnomonError):
    """The guard refused the destination; the message says which address and why."""


@dataclass(frozen=True)
class Destination:
    """The checked address to connect to, and the name it came from."""

    host: str
    address: IPAddress


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``getaddrinfo`` returns for a TCP connection to ``host:port``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parse_networks(cidrs: Sequence[str]) -> tuple[IPNetwork, ...]:
    """``allowed_cidrs`` as networks; raises ValueError on a malformed entry."""
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs)


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4),
    since connecting to the IPv6 form may reach the IPv4 host."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64 or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip: IPAddress) -> str | None:
    """What kind of non-public address ``ip`` is (``"a loopback address"``), or None
    for a publicly routable one. The order picks the most telling name."""
    v4 = embedded_ipv4(ip)
    if v4 is not None:
        inner = classify(v4)
        return None if inner is None else f"an IPv6 form of {v4}, {inner}"
    checks: tuple[tuple[bool, str], ...] = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip in METADATA_ADDRESSES, "a cloud metadata address"),
        (ip.is_link_local, "a link-local address"),
        (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local, "a site-local address"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT, "a carrier-grade NAT address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a globally routable address"),
    )
    return next((name for hit, name in checks if hit), None)


def is_metadata(ip: IPAddress) -> bool:
    """A known metadata address, or anywhere in 169.254/16 (instance services live there)."""
    v4 = ip if isinstance(ip, ipaddress.IPv4Address) else embedded_ipv4(ip)
    return ip in METADATA_ADDRESSES or (v4 is not None and (v4 in METADATA_ADDRESSES or v4 in LINK_LOCAL_V4))


def refusal(ip: IPAddress, *, allow_private: bool, allowed: Sequence[IPNetwork]) -> str | None:
    """Why ``ip`` may not be reached under this policy (``"a loopback address (pool
    policy denies private networks)"``), or None if it may.

    ``allowed`` networks win over everything. ``allow_private`` opens every non-public
    range except the metadata endpoints: those hand out cloud credentials, so reaching
    them takes an explicit ``allowed_cidrs`` entry."""
    v4 = embedded_ipv4(ip)
    if any(ip in net or (v4 is not None and v4 in net) for net in allowed):
        return None
    kind = classify(ip)
    if kind is None:
        return None
    if is_metadata(ip):
        return f"{kind} (only an explicit allowed_cidrs entry permits it)"
    if allow_private:
        return None
    return f"{kind} (pool policy denies private networks)"


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve_checked(host: str, port: int, resolver: Resolver, *, allow_private: bool,
                    allowed: Sequence[IPNetwork]) -> Destination:
    """Resolve ``host`` once and return the address to connect to. Every resolved
    address must pass, not just the chosen one: a name that mixes public and private
    answers is an attack, not a configuration to work around."""
    literal = literal_address(host)
    if literal is not None:
        candidates: list[IPAddress] = [literal]
    else:
        try:
            candidates = [ipaddress.ip_address(a) for a in resolver(host, port)]
        except OSError as exc:
            raise TargetRefused(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not candidates:
            raise TargetRefused(f"cannot resolve {host}: no addresses")
    for ip in candidates:
        why = refusal(ip, allow_private=allow_private, allowed=allowed)
        if why is not None:
            origin = "" if literal is not None else f" (resolved from {host})"
            raise TargetRefused(f"{ip}{origin} is {why}")
    return Destination(host, candidates[0])
