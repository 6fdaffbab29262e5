"""Kafka Connect plugins outside the worker's classpath: built or fetched into the state dir.

``<state_dir>/connect-plugins/`` is the worker's ``plugin.path``; each subdirectory is one
plugin with its own class loader (Connect's isolation), so the plugins' libraries (Avro,
Jackson, Hibernate) never meet the worker's:

* ``gnomon-registry-converter`` -> ``<state_dir>/lib/registry-converter``: gnomon's
  converter for Confluent-framed Avro against the schema registry, **built** with Maven
  from ``connectors/registry-converter`` (its jar plus Avro and Avro's dependencies).
  Rebuilt when a file under that directory changes (a hash marker); ~40 s on a cold
  Maven cache, nothing on later starts.
* ``debezium-jdbc`` -> ``<state_dir>/lib/connect-jdbc``: the JDBC sink connector and the
  PostgreSQL driver, **fetched** from Maven Central (``infra/connect-jdbc/pom.xml``).

The entries are symlinks into ``lib/`` (Connect follows them).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from gnomon.config import REPO_ROOT
from gnomon.infra import fetch
from gnomon.infra.errors import InfraError, require_executable
from gnomon.infra.progress import say

CONVERTER_SOURCE = REPO_ROOT / "connectors" / "registry-converter"
CONVERTER_COMPONENT = "registry-converter"
CONVERTER_CLASS = "gnomon.connect.RegistryAvroConverter"
JDBC_COMPONENT = "connect-jdbc"
JDBC_LABEL = "the JDBC sink connector (Debezium)"
PLUGINS = {"gnomon-registry-converter": CONVERTER_COMPONENT, "debezium-jdbc": JDBC_COMPONENT}


def plugin_path(state_dir: Path) -> Path:
    return state_dir / "connect-plugins"


def source_hash(source: Path = CONVERTER_SOURCE) -> str:
    """Over the pom and every source file (paths and contents), not build output."""
    digest = hashlib.sha256()
    files = [source / "pom.xml", *sorted(p for p in (source / "src").rglob("*") if p.is_file())]
    for f in files:
        digest.update(str(f.relative_to(source)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def build_converter(state_dir: Path) -> Path:
    """Make ``<state_dir>/lib/registry-converter`` hold the built converter and its
    runtime dependencies; return that dir."""
    target = fetch.lib_dir(state_dir, CONVERTER_COMPONENT)
    wanted = source_hash()
    try:
        if (target / fetch.MARKER).read_text().strip() == wanted:
            return target
    except FileNotFoundError:
        pass
    mvn = require_executable("mvn")
    say("building the registry converter for Kafka Connect with Maven (first run only)…")
    started = time.monotonic()
    build = state_dir / "build" / CONVERTER_COMPONENT
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(CONVERTER_SOURCE / "pom.xml"), f"-Dgnomon.build.dir={build}",
           "package", "dependency:copy-dependencies", f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    jars = sorted(build.glob("gnomon-registry-converter-*.jar"))
    if proc.returncode != 0 or not jars:
        shutil.rmtree(staging, ignore_errors=True)
        output = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise InfraError(f"building the registry converter failed (mvn exit {proc.returncode}):\n{output}")
    shutil.copy2(jars[-1], staging / jars[-1].name)
    (staging / fetch.MARKER).write_text(wanted + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    say(f"built the registry converter in {time.monotonic() - started:.0f}s")
    return target


def ensure(state_dir: Path) -> Path:
    """Build/fetch every plugin and link it under ``plugin_path``; return that dir."""
    libs = {CONVERTER_COMPONENT: build_converter(state_dir),
            JDBC_COMPONENT: fetch.fetch(state_dir, JDBC_COMPONENT, JDBC_LABEL)}
    top = plugin_path(state_dir)
    top.mkdir(parents=True, exist_ok=True)
    for name, component in PLUGINS.items():
        link, lib = top / name, libs[component]
        if link.is_symlink() and link.resolve() == lib.resolve():
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(lib, target_is_directory=True)
    return top

