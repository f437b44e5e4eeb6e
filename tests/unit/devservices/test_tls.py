"""The test CA's certificates pass, and fail, a real TLS handshake as clients check them."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from airflow_provider_dblog.devservices.tls import TestCA, make_test_ca


def _handshake(ca_file: Path, cert: Path, key: Path, server_hostname: str) -> None:
    """A client trusting `ca_file` meets a server presenting `cert`, in memory."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(to_client, to_server, server_hostname=server_hostname)
    from_client, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(from_client, from_server, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            from_client.write(to_server.read())
            to_client.write(from_server.read())
        if all(done.values()):
            return
    raise AssertionError(f"the handshake did not finish: {done}")


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


def test_a_server_certificate_verifies_for_its_names(ca: TestCA) -> None:
    cert, key = ca.server_cert(["db.test", "127.0.0.1"])
    _handshake(ca.ca_file, cert, key, "db.test")
    _handshake(ca.ca_file, cert, key, "127.0.0.1")
    assert key.stat().st_mode & 0o777 == 0o600


def test_another_host_name_is_refused(ca: TestCA) -> None:
    cert, key = ca.server_cert(["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(ca.ca_file, cert, key, "localhost")


def test_another_ca_is_refused(ca: TestCA, tmp_path: Path) -> None:
    cert, key = ca.server_cert(["localhost"])
    other = make_test_ca(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(other.ca_file, cert, key, "localhost")


def test_a_client_certificate_is_signed_by_the_ca(ca: TestCA) -> None:
    cert, key = ca.client_cert("dblog")
    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)  # the pair matches
    issued = x509.load_pem_x509_certificate(cert.read_bytes())
    issued.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.ca_file.read_bytes()))
    assert issued.subject.rfc4514_string() == "CN=dblog"
