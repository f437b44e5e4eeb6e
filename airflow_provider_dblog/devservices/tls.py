"""A throwaway certificate authority, so the test servers speak TLS a client can verify.

`make_test_ca(directory)` writes a CA certificate (`ca_file`, what a client trusts) and issues
server certificates for given host names or IP addresses (the names a client checks the
certificate against) and client certificates (for servers that ask for one). Keys are written
mode 0600; a server that runs as another user needs them given to it (`RunAs.own`).
Nothing here is fit for production: the keys are unencrypted and live for 30 days.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = datetime.timedelta(days=30)


@dataclasses.dataclass(frozen=True)
class ServerTLS:
    """What a devservices server needs to require TLS: its certificate and key, and the CA
    that signed them (MariaDB checks client certificates against it)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


@dataclasses.dataclass(frozen=True)
class TestCA:
    """A CA whose certificate is `ca_file`; it signs the certificates it issues into
    `directory`."""

    __test__: ClassVar[bool] = False  # not a pytest test class, whatever its name

    directory: Path
    ca_file: Path
    _key: ec.EllipticCurvePrivateKey = dataclasses.field(repr=False)
    _cert: x509.Certificate = dataclasses.field(repr=False)

    def server_cert(self, hostnames: Sequence[str]) -> tuple[Path, Path]:
        """A certificate (and its key) for a server reached as any of `hostnames`: DNS
        names, or IP addresses (`127.0.0.1`), each a subject alternative name."""
        if not hostnames:
            raise ValueError("a server certificate needs at least one host name")
        names: list[x509.GeneralName] = []
        for name in hostnames:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                names.append(x509.DNSName(name))
        return self._issue(
            f"server-{hostnames[0]}",
            hostnames[0],
            ExtendedKeyUsageOID.SERVER_AUTH,
            x509.SubjectAlternativeName(names),
        )

    def server_tls(self, hostnames: Sequence[str]) -> ServerTLS:
        """`server_cert(hostnames)` with this CA, as a devservices server takes it."""
        cert_file, key_file = self.server_cert(hostnames)
        return ServerTLS(cert_file, key_file, self.ca_file)

    def client_cert(self, user: str) -> tuple[Path, Path]:
        """A client certificate (and its key) whose common name is `user`."""
        return self._issue(f"client-{user}", user, ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def _issue(
        self,
        stem: str,
        common_name: str,
        usage: x509.ObjectIdentifier,
        alt_names: x509.SubjectAlternativeName | None,
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if alt_names is not None:
            builder = builder.add_extension(alt_names, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        suffix = secrets.token_hex(3)  # two certificates for one name never overwrite each other
        cert_file = self.directory / f"{stem}-{suffix}.crt"
        key_file = self.directory / f"{stem}-{suffix}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_file, key)
        return cert_file, key_file


def make_test_ca(directory: Path | str, name: str = "dblog test CA") -> TestCA:
    """A new CA in `directory` (created if missing): `ca.crt` there is what clients trust."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca_file = directory / "ca.crt"
    ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TestCA(directory, ca_file, key, cert)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """The key in PEM, readable by its owner only (PostgreSQL refuses a key others can read)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
