"""A private certificate authority and per-host certificates for the local stack's TLS
(issue 26; docs/deploy.md "Secrets"). ``gnomon infra up --tls`` makes them; production
brings the operator's own files instead.

Files under ``<state_dir>/tls/`` (the directory 0700, every key 0600):

* ``ca.pem`` / ``ca.key``: the CA (EC P-256, valid ``CA_DAYS``); clients trust
  ``ca.pem`` (librdkafka's ``ssl.ca.location``, the brokers' PEM truststore).
* ``<name>.pem`` / ``<name>.key``: a host's certificate (its chain: the leaf, then the
  CA) and its PKCS#8 key, with the host's addresses as subject alternative names, valid
  ``HOST_DAYS``. ``ensure_host`` issues it again when it is missing, names other
  addresses, expires within ``RENEW_BEFORE_DAYS`` or was not signed by the current CA:
  a rotation is a new file in place and a restart of what reads it (the CA stays, so
  clients keep trusting the new certificate).
* ``enabled``: present while the stack runs with TLS (``is_enabled``): the clients of
  this state directory then speak SASL_SSL to Kafka (``gnomon.adapters.kafka``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from gnomon import credentials

CA_DAYS = 3650
HOST_DAYS = 365
RENEW_BEFORE_DAYS = 30
MARKER = credentials.TLS_MARKER


@dataclass(frozen=True)
class HostCert:
    cert: Path  # the leaf then the CA, PEM
    key: Path  # PKCS#8 PEM, unencrypted, 0600
    ca: Path


def tls_dir(state_dir: Path) -> Path:
    return state_dir / credentials.TLS_DIR


def is_enabled(state_dir: Path) -> bool:
    return credentials.tls_enabled(state_dir)


def ca_file(state_dir: Path) -> Path:
    return tls_dir(state_dir) / "ca.pem"


def enable(state_dir: Path, on: bool) -> None:
    marker = tls_dir(state_dir) / MARKER
    if on:
        credentials.ensure_dir(tls_dir(state_dir))
        marker.write_text("TLS on: this stack's Kafka listeners are SASL_SSL (gnomon.infra.tls)\n")
    else:
        marker.unlink(missing_ok=True)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_ca(state_dir: Path) -> tuple[Path, Path]:
    """The CA's certificate and key (made once)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = tls_dir(state_dir)
    credentials.ensure_dir(d)
    cert_path, key_path = d / "ca.pem", d / "ca.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gnomon local CA")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    credentials.write_secret(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()).decode())
    cert_path.write_text(cert.public_bytes(serialization.Encoding.PEM).decode())
    return cert_path, key_path


def _current(cert_path: Path, ca_pem: bytes, ips: list[str], dns: list[str]) -> bool:
    """Is the certificate at ``cert_path`` good for these names, far from expiry, and
    signed by the CA whose certificate is ``ca_pem``?"""
    from cryptography import x509

    try:
        leaf = x509.load_pem_x509_certificates(cert_path.read_bytes())[0]
        ca = x509.load_pem_x509_certificate(ca_pem)
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    have_ips = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    have_dns = set(san.get_values_for_type(x509.DNSName))
    fresh = leaf.not_valid_after_utc - _now() > dt.timedelta(days=RENEW_BEFORE_DAYS)
    return have_ips == set(ips) and have_dns == set(dns) and fresh and leaf.issuer == ca.subject


def ensure_host(state_dir: Path, name: str, ips: list[str], dns: list[str] | None = None,
                *, force: bool = False) -> HostCert:
    """Host ``name``'s certificate for ``ips`` (and ``dns`` names), issued again when it is
    not current (see the module doc) or ``force`` (a rotation)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    dns = dns or ["localhost"]
    ca_cert, ca_key_path = ensure_ca(state_dir)
    d = tls_dir(state_dir)
    cert_path, key_path = d / f"{name}.pem", d / f"{name}.key"
    ca_pem = ca_cert.read_bytes()
    if not force and key_path.exists() and _current(cert_path, ca_pem, ips, dns):
        return HostCert(cert_path, key_path, ca_cert)
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    alt = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(n) for n in dns]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=HOST_DAYS))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    credentials.write_secret(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()).decode())
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca_pem
    credentials.write_secret(cert_path, chain.decode())
    return HostCert(cert_path, key_path, ca_cert)
