"""Per-tenant secrets on the worker host: injected into the job's sandbox by name,
redacted from its log, and refused when missing or loosely protected."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.outbound.secrets import SecretError, SecretStore, env_name
from gnomon.worker.attempt import AttemptContext
from gnomon.worker.command import SandboxedCommandExecutor


def store(tmp_path: Path, tenant: str, name: str, value: str, mode: int = 0o600) -> SecretStore:
    d = tmp_path / tenant
    d.mkdir(mode=0o700, exist_ok=True)
    (d / name).write_text(value + "\n")
    (d / name).chmod(mode)
    return SecretStore(tmp_path)


def attempt(secrets: tuple[str, ...], tenant: str = "acme") -> tuple[AttemptContext, list[tuple[str, str]]]:
    lines: list[tuple[str, str]] = []
    ctx = AttemptContext("j@1", "j", tenant, 1, None, 10, lambda k, line: lines.append((str(k), line)),
                         secrets=secrets)
    return ctx, lines


def test_a_declared_secret_reaches_the_sandbox_and_not_the_log(tmp_path: Path) -> None:
    s = store(tmp_path, "acme", "db-password", "hunter2-very-secret")
    ctx, lines = attempt(("db-password",))
    ex = SandboxedCommandExecutor(extra_env=s.env_for)
    argv = ("sh", "-c", 'test "$GNOMON_SECRET_DB_PASSWORD" = hunter2-very-secret && echo match; '
                        'echo "leak: $GNOMON_SECRET_DB_PASSWORD"')
    result = ex.execute(Target(TargetType.COMMAND, argv=argv), ctx)
    assert result.outcome is Outcome.SUCCEEDED
    out = [line for _, line in lines]
    assert "match" in out and "leak: ***" in out
    assert not any("hunter2" in line for line in out)


def test_another_tenants_secret_is_out_of_reach(tmp_path: Path) -> None:
    s = store(tmp_path, "acme", "db-password", "acme-only")
    ctx, _lines = attempt(("db-password",), tenant="globex")
    result = SandboxedCommandExecutor(extra_env=s.env_for).execute(Target(TargetType.COMMAND, argv=("true",)), ctx)
    assert result.outcome is Outcome.FAILED
    assert "tenant 'globex' has no secret 'db-password'" in (result.error or "")


def test_a_world_readable_secret_is_refused(tmp_path: Path) -> None:
    s = store(tmp_path, "acme", "api-key", "k" * 10, mode=0o644)
    with pytest.raises(SecretError, match="readable by others"):
        s.get("acme", "api-key")


@pytest.mark.parametrize("name", ["../acme/x", "UPPER", "", "a/b"])
def test_secret_names_cannot_walk_the_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(SecretError, match="invalid secret reference"):
        SecretStore(tmp_path).get("acme", name)
    with pytest.raises(SecretError, match="invalid secret reference"):
        SecretStore(tmp_path).get("..", "x")


def test_env_names() -> None:
    assert env_name("db-password") == "GNOMON_SECRET_DB_PASSWORD"


def test_each_line_of_a_multi_line_secret_is_redacted() -> None:
    from gnomon.outbound.secrets import redactor

    pem = "-----BEGIN KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf\n-----END KEY-----"
    redact = redactor([pem])
    assert redact("key line MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf here") == "key line *** here"
    assert redact("ok") == "ok"
