"""The one exception of the infra package, and the check for required executables."""

from __future__ import annotations

import shutil

from gnomon.core.errors import InfraError as _CoreInfraError


class InfraError(_CoreInfraError):
    """A component could not be fetched, started or reached.

    The first line of ``str(exc)`` is a human message without the ``gnomon:`` prefix
    (callers add it); a log excerpt, when there is one, follows on the next lines.
    Subclasses :class:`gnomon.core.errors.InfraError`, so the CLI reports it like any
    other gnomon error (exit code 1).
    """


_INSTALL_HINTS = {
    "mvn": "install Maven 3.8+ (apt-get install maven)",
    "java": "install a Java 17 JDK (apt-get install openjdk-17-jdk-headless) or set JAVA_HOME",
}


def require_executable(name: str) -> str:
    """Absolute path of ``name`` on PATH, or InfraError with a one-line install hint."""
    path = shutil.which(name)
    if path is None:
        hint = _INSTALL_HINTS.get(name, f"install {name}")
        raise InfraError(f"`{name}` not found on PATH; {hint}")
    return path
