"""Finding a suitable ``java`` and building JVM command lines."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from gnomon.infra.errors import InfraError, require_executable


@lru_cache(maxsize=8)
def java_major(java: str) -> int:
    """Feature version of the JVM at ``java`` (8, 11, 17, 21, …)."""
    proc = subprocess.run(
        [java, "-XshowSettings:properties", "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"java\.specification\.version = (\S+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise InfraError(f"`{java} -version` failed; is it a working JDK?")
    spec = m.group(1)
    return int(spec.split(".")[1]) if spec.startswith("1.") else int(spec)


def _candidates() -> list[str]:
    """``$JAVA_HOME/bin/java``, ``java`` on PATH, then JDKs under /usr/lib/jvm (deduplicated)."""
    found: list[str] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        found.append(str(Path(home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        found.append(on_path)
    found.extend(sorted(glob.glob("/usr/lib/jvm/*/bin/java")))
    seen: set[str] = set()
    result = []
    for java in found:
        real = os.path.realpath(java)
        if real not in seen and os.access(real, os.X_OK):
            seen.add(real)
            result.append(java)
    return result


def find_java(supported: tuple[int, ...], component: str) -> str:
    """A ``java`` whose feature version is in ``supported``.

    Prefers ``$JAVA_HOME``, then ``java`` on PATH, then JDKs under ``/usr/lib/jvm``.
    """
    candidates = _candidates()
    if not candidates:
        require_executable("java")  # raises with the install hint
    for java in candidates:
        if java_major(java) in supported:
            return java
    first = candidates[0]
    wanted = " or ".join(str(v) for v in supported)
    raise InfraError(
        f"{component} needs Java {wanted}, but `{first}` is Java {java_major(first)}; "
        f"install a JDK {supported[-1]} or point JAVA_HOME at one"
    )


def classpath(lib: Path) -> str:
    return str(lib / "*")


def find_jar(lib: Path, prefix: str) -> Path:
    """The jar in ``lib`` whose name starts with ``prefix`` (e.g. ``jamm-``)."""
    jars = sorted(lib.glob(f"{prefix}*.jar"))
    if not jars:
        raise InfraError(f"no {prefix}*.jar in {lib}; delete {lib} and run `up` again")
    return jars[-1]
