"""PostgreSQL's LSNs, `16/B374D848` as PostgreSQL prints them, as the unsigned 64-bit integers
the log positions are made of (a transaction's commit LSN is its `Position.commit`)."""

from __future__ import annotations

_U64 = 1 << 64
_U32 = 1 << 32


def parse_pg_lsn(text: str) -> int:
    """'16/B374D848' -> the LSN as an unsigned 64-bit integer."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}")
    try:
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}") from None


def format_pg_lsn(lsn: int) -> str:
    """The inverse of `parse_pg_lsn`, in PostgreSQL's own spelling."""
    if not 0 <= lsn < _U64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & (_U32 - 1):X}"
