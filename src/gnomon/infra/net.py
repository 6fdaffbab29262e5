"""Tiny TCP helpers for health checks and port-conflict detection."""

from __future__ import annotations

import socket


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
