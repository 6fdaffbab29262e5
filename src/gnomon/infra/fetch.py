"""Jars from Maven Central: ``mvn dependency:copy-dependencies`` into the state dir, once.

Each component has a dependency-only pom under ``infra/<component>/pom.xml``. The jars go
to ``<state_dir>/lib/<component>``; a marker file holding the pom's hash is written after
a successful copy, so later runs skip Maven entirely (and a changed pom refetches).
Maven's own cache (``~/.m2``) makes refetches cheap.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from gnomon.config import REPO_ROOT
from gnomon.infra.errors import InfraError, require_executable
from gnomon.infra.progress import say

INFRA_DIR = REPO_ROOT / "infra"
MARKER = ".fetched"


def pom_path(component: str) -> Path:
    return INFRA_DIR / component / "pom.xml"


def lib_dir(state_dir: Path, component: str) -> Path:
    return state_dir / "lib" / component


def _pom_hash(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def is_fetched(state_dir: Path, component: str) -> bool:
    marker = lib_dir(state_dir, component) / MARKER
    try:
        return marker.read_text().strip() == _pom_hash(pom_path(component))
    except FileNotFoundError:
        return False


def fetch(state_dir: Path, component: str, label: str) -> Path:
    """Make sure ``<state_dir>/lib/<component>`` holds the pom's jars; return that dir."""
    target = lib_dir(state_dir, component)
    pom = pom_path(component)
    if not pom.exists():
        raise InfraError(f"{pom} is missing; is this a complete gnomon checkout?")
    if is_fetched(state_dir, component):
        return target
    mvn = require_executable("mvn")
    say(f"fetching {label} jars from Maven Central (first run only)…")
    started = time.monotonic()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise InfraError(
            f"fetching {label} jars failed (mvn exit {proc.returncode}); "
            f"is Maven Central reachable?\n{output}"
        )
    (staging / MARKER).write_text(_pom_hash(pom) + "\n")
    shutil.rmtree(target, ignore_errors=True)  # a changed pom must not leave stale jars
    staging.rename(target)
    say(f"fetched {label} jars in {time.monotonic() - started:.0f}s")
    return target
