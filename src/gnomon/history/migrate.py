"""Apply the CQL migrations in ``schemas/cql`` (``V<n>__<name>.cql``) in order, each once.

Every file is plain CQL runnable by ``cqlsh -f`` against keyspace ``gnomon``. To apply
it to another keyspace (tests use ``gnomon_test_<random>``) the migrator rewrites the
file's ``CREATE KEYSPACE ... gnomon`` and ``USE gnomon`` statements: the keyspace name,
and the replication if one is given. Table statements are unqualified and run in the
target keyspace.

Applied versions are recorded in ``<keyspace>.schema_version`` with the file's sha256;
an applied file that has changed since is refused (write a new version instead). All
statements are ``IF NOT EXISTS``, so applying a file twice, or concurrently from two
processes, is harmless.

    python -m gnomon.history.migrate [--keyspace gnomon] [--replication "{'class': ...}"]

It logs in like every gnomon Cassandra client (``gnomon.history.session.connect``):
``$GNOMON_CASSANDRA_USERNAME``/``$GNOMON_CASSANDRA_PASSWORD``, else the role ``gnomon``
from ``<credentials_dir>/cassandra.json`` (written by ``gnomon infra up``). That role may
create keyspaces; a keyspace's creator gets every permission on it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnomon._data import CQL, data_path
from gnomon.core.errors import HistoryStoreError, ValidationError
from gnomon.history.session import connect, translate_errors

__all__ = [
    "DEFAULT_CQL_DIR",
    "DEV_REPLICATION",
    "Migration",
    "applied_versions",
    "load_migrations",
    "migrate",
    "split_statements",
]

log = logging.getLogger(__name__)

# Packaged with gnomon (gnomon/_data/cql: in a checkout a symlink to schemas/cql).
DEFAULT_CQL_DIR = data_path(CQL)
DEV_REPLICATION = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
_FILE_RE = re.compile(r"^V(\d+)__(\w+)\.cql$")
_IDENT_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_KEYSPACE_RE = re.compile(
    r"^CREATE\s+KEYSPACE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s+WITH\s+replication\s*=\s*(\{.*?\})(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_USE_RE = re.compile(r"^USE\s+(\w+)$", re.IGNORECASE)
SCHEMA_VERSION_DDL = (
    "CREATE TABLE IF NOT EXISTS {ks}.schema_version "
    "(version int PRIMARY KEY, name text, sha256 text, applied_at timestamp)"
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def statements(self, keyspace: str, replication: str | None) -> list[str]:
        """The file's statements for ``keyspace`` (``USE`` dropped, keyspace renamed)."""
        out: list[str] = []
        for stmt in split_statements(self.text):
            if m := _KEYSPACE_RE.match(stmt):
                out.append(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                           f"{replication or m.group(2)}{m.group(3)}")
            elif _USE_RE.match(stmt):
                continue
            else:
                out.append(stmt)
        return out


def load_migrations(cql_dir: Path = DEFAULT_CQL_DIR) -> list[Migration]:
    """The ``V<n>__*.cql`` files of ``cql_dir``, by version; duplicate versions refused."""
    found: dict[int, Migration] = {}
    if not cql_dir.is_dir():
        raise HistoryStoreError(f"no CQL migrations directory at {cql_dir}")
    for path in sorted(cql_dir.iterdir()):
        m = _FILE_RE.match(path.name)
        if not m:
            continue
        version = int(m.group(1))
        if version in found:
            raise HistoryStoreError(f"two migrations with version {version}: {found[version].path.name}, {path.name}")
        found[version] = Migration(version, m.group(2), path, path.read_text(encoding="utf-8"))
    if not found:
        raise HistoryStoreError(f"no V<n>__<name>.cql files in {cql_dir}")
    return [found[v] for v in sorted(found)]


def split_statements(text: str) -> list[str]:
    """CQL text -> statements without comments or the trailing ``;``. Understands
    ``--`` / ``//`` line comments, ``/* */`` block comments and quoted strings."""
    return [s for s in (" ".join(part.split()) for part in _split(text)) if s]


def _split(text: str) -> Iterator[str]:
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        two = text[i:i + 2]
        if two in ("--", "//"):
            j = text.find("\n", i)
            i = n if j < 0 else j
            buf.append(" ")
        elif two == "/*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            buf.append(" ")
        elif c in ("'", '"'):
            j = i + 1
            while j < n:
                if text[j] == c:
                    if text[j + 1:j + 2] == c:  # doubled quote: an escaped quote
                        j += 2
                        continue
                    break
                j += 1
            buf.append(text[i:j + 1])
            i = j + 1
        elif c == ";":
            yield "".join(buf)
            buf = []
            i += 1
        else:
            buf.append(c)
            i += 1
    yield "".join(buf)


def check_keyspace_name(keyspace: str) -> str:
    if not _IDENT_RE.match(keyspace):
        raise ValidationError("keyspace", f"must match {_IDENT_RE.pattern}; got {keyspace!r}")
    return keyspace


def applied_versions(session: Any, keyspace: str) -> dict[int, str]:
    """version -> sha256 of the migrations recorded in ``keyspace``."""
    rows = session.execute(f"SELECT version, sha256 FROM {keyspace}.schema_version")
    return {r.version: r.sha256 for r in rows}


def migrate(
    session: Any,
    keyspace: str = "gnomon",
    *,
    replication: str | None = None,
    cql_dir: Path = DEFAULT_CQL_DIR,
) -> list[int]:
    """Apply the migrations of ``cql_dir`` not yet recorded in ``keyspace``; return the
    versions applied now. ``session`` is a cassandra-driver Session (any keyspace).
    ``replication`` (a CQL map literal) overrides the files' replication for a keyspace
    that does not exist yet; an existing keyspace is never altered.
    Raises ``HistoryStoreError`` (driver errors translated, changed files refused)."""
    check_keyspace_name(keyspace)
    migrations = load_migrations(cql_dir)
    with translate_errors(f"migrate keyspace {keyspace}"):
        first = migrations[0].statements(keyspace, replication)
        create_ks = [s for s in first if _KEYSPACE_RE.match(s)]
        if not create_ks:
            raise HistoryStoreError(f"{migrations[0].path.name} does not create the keyspace")
        session.execute(create_ks[0])
        session.execute(SCHEMA_VERSION_DDL.format(ks=keyspace))
        done = applied_versions(session, keyspace)
        applied: list[int] = []
        for mig in migrations:
            if mig.version in done:
                if done[mig.version] != mig.sha256:
                    raise HistoryStoreError(
                        f"{mig.path.name} changed after it was applied to keyspace {keyspace} "
                        "(applied migrations are immutable: add a new V<n> file)"
                    )
                continue
            log.info("applying %s to keyspace %s", mig.path.name, keyspace)
            for stmt in mig.statements(keyspace, replication):
                if _KEYSPACE_RE.match(stmt):
                    session.execute(stmt)
                else:
                    session.execute(_qualify(stmt, keyspace))
            session.execute(
                f"INSERT INTO {keyspace}.schema_version (version, name, sha256, applied_at) "
                "VALUES (%s, %s, %s, toTimestamp(now()))",
                (mig.version, mig.name, mig.sha256),
            )
            applied.append(mig.version)
    return applied


_TABLE_RE = re.compile(
    r"^((?:CREATE|ALTER|DROP)\s+(?:TABLE|TYPE)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?)(\w+)(\s.*)?$",
    re.IGNORECASE | re.DOTALL,
)


def _qualify(stmt: str, keyspace: str) -> str:
    """Prefix the table or type of a DDL statement with ``keyspace`` (files use bare names)."""
    m = _TABLE_RE.match(stmt)
    if not m:
        raise HistoryStoreError(
            f"unsupported migration statement (expected CREATE/ALTER/DROP TABLE|TYPE with a bare name): {stmt[:80]}"
        )
    return f"{m.group(1)}{keyspace}.{m.group(2)}{m.group(3) or ''}"


def main(argv: list[str] | None = None) -> int:
    from gnomon.config import load

    parser = argparse.ArgumentParser(prog="python -m gnomon.history.migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keyspace", default="gnomon")
    parser.add_argument("--replication", default=None,
                        help="CQL map for a new keyspace, e.g. \"{'class': 'NetworkTopologyStrategy', 'dc1': 3}\"")
    parser.add_argument("--cql-dir", type=Path, default=DEFAULT_CQL_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    s = load()
    try:
        cluster, session = connect(s.cassandra_hosts, s.cassandra_port)
        try:
            applied = migrate(session, args.keyspace, replication=args.replication, cql_dir=args.cql_dir)
        finally:
            cluster.shutdown()
    except (HistoryStoreError, ValidationError) as exc:
        print(f"gnomon migrate: {exc}", file=sys.stderr)
        return 1
    print(f"keyspace {args.keyspace}: applied {applied or 'nothing (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
