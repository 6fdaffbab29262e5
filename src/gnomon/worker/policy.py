"""A worker pool's policy: which tenants it serves and which targets it runs for them.

The secure default is the empty policy: a pool serves only the tenants named on the
command line, runs their in-process handlers (the pool owner's trusted code) and HTTP
callbacks to public addresses, and no commands or containers at all. A policy file
(TOML, ``gnomon worker --policy FILE``) widens that::

    tenants = ["acme", "globex"]          # a shared pool: sandboxed targets only

    [commands]                            # off unless enabled
    enabled = true
    executables = ["sh", "/usr/bin/python3"]
    tenants = ["acme"]                    # entitled tenants (default: all served)
    network = false

    [containers]
    enabled = true
    images = ["localhost/report:1"]

    [limits]                              # per sandboxed attempt
    memory_mb = 512
    pids_max = 64
    cpu_s = 3600
    cpus = 1.0
    output_mb = 8
    tmp_mb = 64

    [http]
    allow_private = false                 # loopback / RFC 1918 / link-local callbacks
    allowed_cidrs = []                    # exceptions, e.g. ["10.1.2.0/24"]
    allow_plain_http = false              # https only unless true
    allowed_ports = []                    # default 443, 8443 (and 80, 8080 with plain http)

``PoolPolicy.refusal(target_type, argv0_or_image, tenant)`` says why an attempt may not
run (a sentence for the run's log), or None.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnomon.core.errors import GnomonError
from gnomon.core.model import TargetType
from gnomon.outbound.http import HttpPolicy, parse_ports
from gnomon.worker.sandbox import MIB, SandboxLimits


class PolicyError(GnomonError):
    """A policy file that cannot be used; the message names the key."""


@dataclass(frozen=True)
class SandboxedTargets:
    """Commands or containers: off unless enabled, then only the listed programs."""

    enabled: bool = False
    allowed: frozenset[str] = frozenset()  # executables (argv[0]) or images
    tenants: frozenset[str] | None = None  # None: every tenant the pool serves
    network: bool = False


@dataclass(frozen=True)
class PoolPolicy:
    tenants: frozenset[str]
    commands: SandboxedTargets = field(default_factory=SandboxedTargets)
    containers: SandboxedTargets = field(default_factory=SandboxedTargets)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    http: HttpPolicy = field(default_factory=HttpPolicy)

    def __post_init__(self) -> None:
        if not self.tenants:
            raise PolicyError("tenants: a pool must serve at least one tenant")

    @property
    def shared(self) -> bool:
        """Serves more than one tenant: in-process handlers are refused."""
        return len(self.tenants) > 1

    def with_tenants(self, tenants: Iterable[str]) -> PoolPolicy:
        return PoolPolicy(frozenset(tenants), self.commands, self.containers, self.limits, self.http)

    def refusal(self, kind: TargetType, program: str, tenant: str) -> str | None:
        """Why this attempt may not run here, or None. ``program`` is argv[0] or the image."""
        if tenant not in self.tenants:
            return f"this pool does not serve tenant {tenant!r}"
        if kind is TargetType.HANDLER:
            if self.shared:
                return ("this pool is shared by several tenants and runs only sandboxed targets; "
                        "in-process handlers run on a pool of their owner's")
            return None
        if kind is TargetType.HTTP:
            return None
        rules, what = (self.commands, "command") if kind is TargetType.COMMAND else (self.containers, "container")
        if not rules.enabled:
            return f"{what} targets are off on this pool (its policy does not enable them)"
        if rules.tenants is not None and tenant not in rules.tenants:
            return f"tenant {tenant!r} is not entitled to {what} targets on this pool"
        if program not in rules.allowed:
            label = "executable" if kind is TargetType.COMMAND else "image"
            return f"{label} {program!r} is not allowed by this pool's policy (allowed: {', '.join(sorted(rules.allowed)) or 'none'})"
        return None

    @classmethod
    def load(cls, path: Path, tenants: Iterable[str] = ()) -> PoolPolicy:
        """Read a policy file; ``tenants`` (from the command line) are added to its own."""
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise PolicyError(f"{path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML: {exc}") from None
        return cls.from_mapping(data, tenants, source=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], tenants: Iterable[str] = (), source: str = "policy") -> PoolPolicy:
        _only(data, {"tenants", "commands", "containers", "limits", "http"}, source, "")
        served = frozenset(_strings(data.get("tenants", []), f"{source}: tenants")) | frozenset(tenants)
        if not served:
            raise PolicyError(f"{source}: tenants: name the tenants this pool serves (or pass --tenant)")
        policy = cls(
            served,
            _sandboxed(data.get("commands", {}), f"{source}: commands", "executables"),
            _sandboxed(data.get("containers", {}), f"{source}: containers", "images"),
            _limits(data.get("limits", {}), f"{source}: limits"),
            _http(data.get("http", {}), f"{source}: http"),
        )
        for rules, what in ((policy.commands, "commands"), (policy.containers, "containers")):
            if rules.tenants is not None and not rules.tenants <= served:
                extra = ", ".join(sorted(rules.tenants - served))
                raise PolicyError(f"{source}: {what}.tenants: {extra} not among the tenants this pool serves")
        return policy


def _only(data: Mapping[str, Any], allowed: set[str], source: str, prefix: str) -> None:
    if not isinstance(data, Mapping):
        raise PolicyError(f"{source}: {prefix.rstrip('.') or 'policy'}: must be a table")
    for key in data:
        if key not in allowed:
            raise PolicyError(f"{source}: {prefix}{key}: unknown key; allowed: {', '.join(sorted(allowed))}")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(f"{where}: must be a list of non-empty strings")
    return list(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: must be true or false")
    return value


def _sandboxed(data: Any, where: str, list_key: str) -> SandboxedTargets:
    _only(data, {"enabled", list_key, "tenants", "network"}, where.split(":")[0], where.split(": ")[1] + ".")
    tenants = data.get("tenants")
    return SandboxedTargets(
        enabled=_bool(data.get("enabled", False), f"{where}.enabled"),
        allowed=frozenset(_strings(data.get(list_key, []), f"{where}.{list_key}")),
        tenants=None if tenants is None else frozenset(_strings(tenants, f"{where}.tenants")),
        network=_bool(data.get("network", False), f"{where}.network"),
    )


_LIMIT_KEYS = {"memory_mb": ("memory_max_bytes", MIB), "pids_max": ("pids_max", 1), "cpu_s": ("cpu_time_max_s", 1),
               "output_mb": ("output_max_bytes", MIB), "tmp_mb": ("tmp_max_bytes", MIB),
               "file_mb": ("file_size_max_bytes", MIB), "open_files_max": ("open_files_max", 1)}


def _limits(data: Any, where: str) -> SandboxLimits:
    _only(data, {*_LIMIT_KEYS, "cpus"}, where.split(":")[0], "limits.")
    kwargs: dict[str, Any] = {}
    for key, (attr, unit) in _LIMIT_KEYS.items():
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PolicyError(f"{where}.{key}: must be a positive integer")
            kwargs[attr] = value * unit
    if "cpus" in data:
        cpus = data["cpus"]
        if isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus <= 256:
            raise PolicyError(f"{where}.cpus: must be a number of cores between 0 and 256")
        kwargs["cpu_cores_max"] = float(cpus)
    if kwargs.get("pids_max", 0) > SandboxLimits.uid_processes_max:
        kwargs["uid_processes_max"] = kwargs["pids_max"]
    try:
        return SandboxLimits(**kwargs)
    except AssertionError as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _http(data: Any, where: str) -> HttpPolicy:
    _only(data, {"allow_private", "allowed_cidrs", "allow_plain_http", "allowed_ports"}, where.split(":")[0], "http.")
    cidrs = _strings(data.get("allowed_cidrs", []), f"{where}.allowed_cidrs")
    for c in cidrs:
        try:
            ipaddress.ip_network(c, strict=False)
        except ValueError:
            raise PolicyError(f"{where}.allowed_cidrs: {c!r} is not a network (like 10.0.0.0/8)") from None
    raw_ports = data.get("allowed_ports", [])
    if not isinstance(raw_ports, list) or not all(isinstance(p, int | str) and not isinstance(p, bool)
                                                  for p in raw_ports):
        raise PolicyError(f"{where}.allowed_ports: must be a list of ports or ranges (like [443, \"8000-8999\"])")
    ports = tuple(str(p) for p in raw_ports)
    try:
        parse_ports(ports)
    except ValueError as exc:
        raise PolicyError(f"{where}.allowed_ports: {exc}") from None
    return HttpPolicy(_bool(data.get("allow_private", False), f"{where}.allow_private"), tuple(cidrs),
                      allow_plain_http=_bool(data.get("allow_plain_http", False), f"{where}.allow_plain_http"),
                      allowed_ports=ports)
