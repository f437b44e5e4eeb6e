"""Binlog coordinates (a file name and an offset) as one integer that grows in commit order:
the file number in the high 32 bits, the offset in the low ones, a transaction's
`Position.commit`."""

from __future__ import annotations

_U32 = 1 << 32


def mysql_commit(file_number: int, offset: int) -> int:
    """Binlog coordinates as one integer that grows in commit order."""
    if not (0 <= file_number < _U32 and 0 <= offset < _U32):
        raise ValueError(f"binlog coordinates out of range: file {file_number}, offset {offset}")
    return (file_number << 32) | offset


def binlog_file_number(file_name: str) -> int:
    """'mysql-bin.000042' -> 42."""
    _, _, suffix = file_name.rpartition(".")
    if not suffix.isdigit():
        raise ValueError(f"not a binlog file name: {file_name!r}")
    return int(suffix)
