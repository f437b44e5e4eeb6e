"""Why a TLS connection to Redis ended at once: the server refusing this client's certificate.

With TLS 1.3 a server checks the client's certificate after the handshake has completed on the
client's side, so a refusal (a certificate from a CA the server does not trust, an expired one)
reaches redis-py as an EOF on its first write ("EOF occurred in violation of protocol"), which
reads as an outage. The server sent an alert saying why before it closed: a probe connection
with the same certificate, waiting for the server's first word, reads it.
"""

from __future__ import annotations

import socket
import ssl

import redis
import redis.asyncio
import redis.sentinel


class UnknownSentinelService(redis.ConnectionError):
    """Every sentinel answered and none watches the configured service (`no_primary_error`
    raises it): a configuration error, not an outage."""


class ClientCertificateRefused(redis.ConnectionError):
    """A sentinel refused this client's certificate (`no_primary_error` raises it instead of
    "no sentinel names a primary"): a configuration error, not an outage."""


PROBE_TIMEOUT_S = 2.0
"""How long the probe waits for an alert. A server that took the certificate says nothing
until a command comes, so a refusal is known at once and an acceptance takes this long."""


def refused_client_certificate(client: redis.Redis | redis.asyncio.Redis) -> str | None:
    """The alert the server sends a connection offering `client`'s certificate (such as
    `TLSV1_ALERT_UNKNOWN_CA`), or None: no client certificate, no alert (the certificate was
    taken), or no server to ask. Only the certificate is offered: no password, no command."""
    kwargs = client.connection_pool.connection_kwargs
    cert_file = kwargs.get("ssl_certfile")
    if not cert_file:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the server's certificate is not what is in question
    context.verify_mode = ssl.CERT_NONE
    try:
        context.load_cert_chain(cert_file, kwargs.get("ssl_keyfile"), kwargs.get("ssl_password"))
        host, port = _server(client)
        with (
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.recv(1)
    except ssl.SSLError as exc:
        reason = exc.reason or ""
        return reason if "ALERT" in reason else None
    except (OSError, redis.RedisError):
        return None
    return None


def _server(client: redis.Redis | redis.asyncio.Redis) -> tuple[str, int]:
    """The server the client's connections go to (with sentinels, the primary they name)."""
    pool = client.connection_pool
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
        return str(host), int(port)
    kwargs = pool.connection_kwargs
    return str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))
