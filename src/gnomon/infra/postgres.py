"""PostgreSQL from the Debian package, one private server on 127.0.0.1, for the exports.

Kafka Connect's JDBC sink writes finished runs into it (``connectors/runs-postgres-sink``);
nothing else in gnomon needs it. Started on demand: ``python -m gnomon.infra up --only
postgres`` (and by ``up --only connect``); ``status`` and ``down`` include it.

Binaries: ``initdb``/``pg_ctl`` of the newest ``/usr/lib/postgresql/<major>/bin`` (Debian
package ``postgresql``: ``make sysdeps`` installs it). Data dir
``<state_dir>/postgres/data``, log ``<state_dir>/postgres/postgres.log``, Unix socket in
``<state_dir>/postgres``. As root, every server command runs as the ``postgres`` user
(``runuser``), which owns ``<state_dir>/postgres``; the state dir must be traversable.

Port ``$GNOMON_POSTGRES_PORT`` (default 15432, ``Settings.postgres_port``), bound to
127.0.0.1 only. One superuser ``gnomon`` with a generated password
(``<credentials_dir>/postgres.json``, SCRAM), database ``gnomon``. :func:`query` runs SQL
through ``psql`` (no Python driver needed).

The JDBC sink logs in as ``gnomon_export`` (``<credentials_dir>/postgres-export.json``), a
role that may only create and write tables in the ``public`` schema of ``gnomon``: not a
superuser. Every start sets its password from that file, sent as a SCRAM verifier, so the
password itself is never on a command line.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from gnomon import credentials
from gnomon.config import Settings
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open

LABEL = "PostgreSQL"
HOST = "127.0.0.1"
CREDENTIAL = "postgres"  # <credentials_dir>/postgres.json
USERNAME = "gnomon"
DATABASE = "gnomon"
EXPORT_CREDENTIAL = "postgres-export"  # <credentials_dir>/postgres-export.json
EXPORT_USER = "gnomon_export"  # the JDBC sink's role: no superuser
EXPORT_TABLES = ("gnomon_runs",)  # tables the sink writes, owned by EXPORT_USER
SCRAM_ITERATIONS = 4096  # PostgreSQL's default for scram-sha-256
OS_USER = "postgres"  # the Debian package's system user; the server never runs as root
SERVER_ROOT = Path("/usr/lib/postgresql")  # Debian: one <major>/bin per installed server
INSTALL_HINT = "install the Debian package postgresql (`make sysdeps`, or apt-get install postgresql)"


def home(settings: Settings) -> Path:
    return settings.state_dir / "postgres"


def data_dir(settings: Settings) -> Path:
    return home(settings) / "data"


def log_file(settings: Settings) -> Path:
    return home(settings) / "postgres.log"


def address(settings: Settings) -> str:
    return f"{HOST}:{settings.postgres_port}"


def jdbc_url(settings: Settings) -> str:
    return f"jdbc:postgresql://{HOST}:{settings.postgres_port}/{DATABASE}"


def bin_dir() -> Path:
    """The newest installed server's bin dir; InfraError with the install hint if none."""
    found = sorted((p for p in SERVER_ROOT.glob("*/bin") if (p / "initdb").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not found:
        raise InfraError(f"PostgreSQL server binaries not found ({SERVER_ROOT}/<major>/bin/initdb); {INSTALL_HINT}")
    return found[-1]


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    runuser = shutil.which("runuser")
    if runuser is None:
        raise InfraError("running as root needs `runuser` (util-linux) to start PostgreSQL as user postgres")
    return [runuser, "-u", OS_USER, "--", *argv]


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, OS_USER, OS_USER)


def _run(argv: list[str], what: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=env, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        output = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise InfraError(f"{what} failed (exit {proc.returncode}):\n{output}")
    return proc.stdout


def credential(settings: Settings) -> credentials.Credential:
    """The superuser's credential, generated on first use."""
    credentials.ensure_dir(settings.credentials_dir)
    return credentials.ensure(settings.credentials_dir, CREDENTIAL, USERNAME)


def export_credential(settings: Settings) -> credentials.Credential:
    """The export role's credential, generated on first use."""
    credentials.ensure_dir(settings.credentials_dir)
    return credentials.ensure(settings.credentials_dir, EXPORT_CREDENTIAL, EXPORT_USER)


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677), which
    ``ALTER ROLE ... PASSWORD`` takes as it is."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = base64.b64encode
    return (f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}$"
            f"{b64(hashlib.sha256(client_key).digest()).decode()}:{b64(server_key).decode()}")


def ensure_export_role(settings: Settings) -> None:
    """Create or update the export role (idempotent): LOGIN with the credential file's
    password, no superuser, CREATE on ``public`` of ``gnomon``; the sink's tables are its own
    (a table made by an older release as the superuser is handed over)."""
    cred = export_credential(settings)
    role = cred.username
    if not role.replace("_", "").isalnum():
        raise InfraError(f"{credentials.path(settings.credentials_dir, EXPORT_CREDENTIAL)}: username {role!r} "
                         "must be letters, digits and _")
    query(settings, f"""DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {_literal(role)}) THEN CREATE ROLE {role}; END IF;
END $$;
ALTER ROLE {role} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD {_literal(scram_verifier(cred.password))};
GRANT CONNECT ON DATABASE {DATABASE} TO {role};
GRANT USAGE, CREATE ON SCHEMA public TO {role};""")
    for table in EXPORT_TABLES:
        query(settings, f"ALTER TABLE IF EXISTS public.{table} OWNER TO {role}")


def _initdb(settings: Settings, binaries: Path) -> None:
    cred = credential(settings)
    home(settings).mkdir(parents=True, exist_ok=True)
    _chown_to_server_user(home(settings))
    pwfile = home(settings) / ".pwfile"
    credentials.write_secret(pwfile, cred.password + "\n")
    _chown_to_server_user(pwfile)
    try:
        _run(_as_server_user([str(binaries / "initdb"), "-D", str(data_dir(settings)), "-U", cred.username,
                              f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C"]),
             "initdb")
    finally:
        pwfile.unlink(missing_ok=True)


def pid(settings: Settings) -> int | None:
    """The postmaster's pid if it runs (from ``postmaster.pid``)."""
    try:
        first = (data_dir(settings) / "postmaster.pid").read_text().splitlines()[0]
        value = int(first)
    except (FileNotFoundError, IndexError, ValueError, PermissionError):
        return None
    try:
        os.kill(value, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return value
    return value


def start(settings: Settings, timeout_s: float = 60.0) -> int:
    """initdb (first time), start the server unless it runs, create the database; the pid."""
    running = pid(settings)
    if running is not None:
        ensure_export_role(settings)  # a rotated credential file takes effect
        return running
    binaries = bin_dir()
    if not (data_dir(settings) / "PG_VERSION").exists():
        shutil.rmtree(data_dir(settings), ignore_errors=True)  # a half-done initdb
        _initdb(settings, binaries)
    if port_open(HOST, settings.postgres_port):
        raise InfraError(f"{address(settings)} is already in use by another process; stop it or choose "
                         "another port (GNOMON_POSTGRES_PORT)")
    options = (f"-c listen_addresses={HOST} -p {settings.postgres_port} -k {home(settings)} "
               "-c shared_buffers=32MB -c max_connections=40 -c fsync=on")
    _run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data_dir(settings)), "-l", str(log_file(settings)),
                          "-o", options, "-w", "-t", str(int(timeout_s)), "start"]),
         f"starting PostgreSQL on {address(settings)}", timeout_s=timeout_s + 10)
    wait_ready(settings, timeout_s)
    if not query(settings, f"SELECT 1 FROM pg_database WHERE datname = {_literal(DATABASE)}", database="postgres"):
        query(settings, f"CREATE DATABASE {DATABASE}", database="postgres")
    ensure_export_role(settings)
    started = pid(settings)
    if started is None:
        raise InfraError(f"PostgreSQL started but has no postmaster.pid; see {log_file(settings)}")
    return started


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def wait_ready(settings: Settings, timeout_s: float = 60.0) -> float:
    begun = time.monotonic()
    last = ""
    while time.monotonic() - begun < timeout_s:
        try:
            query(settings, "SELECT 1", database="postgres")
            return time.monotonic() - begun
        except InfraError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise InfraError(f"PostgreSQL did not answer on {address(settings)} in {timeout_s:.0f}s: {last}")


def query(settings: Settings, sql: str, *, database: str = DATABASE, timeout_s: float = 30.0) -> list[list[str]]:
    """Run ``sql`` with psql as the superuser; the result rows (CSV-parsed strings; NULL is "")."""
    psql = shutil.which("psql") or str(bin_dir() / "psql")
    cred = credential(settings)
    env = {**os.environ, "PGPASSWORD": cred.password, "PGCONNECT_TIMEOUT": "5"}
    out = _run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "--csv", "-t", "-h", HOST, "-p", str(settings.postgres_port),
                "-U", cred.username, "-d", database, "-c", sql], "psql", timeout_s=timeout_s, env=env)
    return [row for row in csv.reader(io.StringIO(out)) if row]


def stop(settings: Settings, timeout_s: float = 60.0) -> bool:
    """Stop the server (fast shutdown); True if it was running."""
    if pid(settings) is None:
        return False
    _run(_as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(data_dir(settings)), "-m", "fast", "-w",
                          "-t", str(int(timeout_s)), "stop"]), "stopping PostgreSQL", timeout_s=timeout_s + 10)
    return True


def running_names(settings: Settings) -> list[str]:
    return ["postgres"] if pid(settings) is not None else []


def status(settings: Settings) -> dict[str, Any]:
    running = pid(settings)
    if running is None:
        return {"state": "down"}
    info: dict[str, Any] = {"pid": running, "address": address(settings), "database": DATABASE}
    try:
        info["version"] = query(settings, "SHOW server_version", database="postgres", timeout_s=5)[0][0]
    except (InfraError, IndexError):
        return {"state": "starting", **info}
    return {"state": "up", **info}
