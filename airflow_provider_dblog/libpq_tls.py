"""libpq's refusals of a TLS set-up that cannot work, told apart from an outage (for the
PostgreSQL source and the SQL target alike, so it lives outside `sources/postgres/`).

psycopg raises every failed connection as `OperationalError` with libpq's text. These words say
the client refused the server, or could not use the files the DSN names: no retry mends that,
so the source and the SQL target stop with a configuration error naming it instead of waiting
for a server that will never pass.
"""

from __future__ import annotations

_REFUSALS = (
    (
        "certificate verify failed",
        "the server's certificate does not verify against the CA in sslrootcert",
    ),
    ("does not match host name", "the server's certificate is for another host name"),
    ("certificate file", "a certificate file the DSN names cannot be read"),
    ("private key file", "the key file the DSN names cannot be read"),
    ("server does not support SSL", "the server does not speak TLS"),
)


def tls_refusal(message: str) -> str | None:
    """What is wrong with TLS, if libpq's `message` says it refused it; None otherwise."""
    for words, meaning in _REFUSALS:
        if words in message:
            return meaning
    return None
