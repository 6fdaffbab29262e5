"""`gnomon infra cert`: the API's HTTPS certificate from the state directory's private CA."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from typer.testing import CliRunner

from gnomon.cli.main import app


def _leaf(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


def test_issues_keeps_and_renews_a_server_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    runner = CliRunner()
    out = runner.invoke(app, ["infra", "cert", "api-1", "--ip", "10.0.0.1", "--ip", "127.0.0.1", "--dns", "api.example"])
    assert out.exit_code == 0, out.output
    cert_path, key_path, ca_path = (tmp_path / "tls" / f for f in ("api-1.pem", "api-1.key", "ca.pem"))
    assert f"gnomon api --tls-cert {cert_path} --tls-key {key_path}" in out.output
    assert f"GNOMON_API_CA_FILE={ca_path}" in out.output
    leaf = _leaf(cert_path)
    alt = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(alt.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("10.0.0.1"),
                                                            ipaddress.ip_address("127.0.0.1")}
    assert alt.get_values_for_type(x509.DNSName) == ["api.example"]
    assert leaf.issuer == _leaf(ca_path).subject
    assert key_path.stat().st_mode & 0o077 == 0  # the key is private
    again = ["infra", "cert", "api-1", "--ip", "10.0.0.1", "--ip", "127.0.0.1", "--dns", "api.example"]
    assert runner.invoke(app, again).exit_code == 0
    assert _leaf(cert_path).serial_number == leaf.serial_number  # current: kept
    assert runner.invoke(app, [*again, "--renew"]).exit_code == 0
    assert _leaf(cert_path).serial_number != leaf.serial_number  # a rotation: a new one in place


@pytest.mark.parametrize(("argv", "line"), [
    (["api-1", "--ip", "nope"], "gnomon: --ip: 'nope' is not an IP address"),
    (["../x"], "gnomon: name: letters, digits, '-', '_' and '.' only (it names files)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          argv: list[str], line: str) -> None:
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    out = CliRunner().invoke(app, ["infra", "cert", *argv])
    assert out.exit_code == 2 and out.output.strip().splitlines() == [line]
    assert not (tmp_path / "tls").exists()  # nothing issued
