"""Log row events built with their lines: the envelope every log reader writes, in one place.

A log reader spells a row change's key and rows as JSON and builds its event here. Its line is
the envelope `event_codec.log_line_format` spells for its table, filled with that JSON, its
position, and what the table's events in one transaction share (`LogOrigin`) and its schema
version; the event carries the line (`EncodedLogEvent`), which the writer thread writes as it
is. A reader first fills in what a table's events in a transaction share, then each change's
or run of changes' own part: the binlog reader with `TransactionLines`, a change or a rows
event (`LogLines`) at a time; the PostgreSQL reader a change at a time, each into a run of its
transaction's changes (`sources/postgres/changes.py`), with `TableLines.formats` for a table's
first change of an operation in the run and `TableLines.transaction_format` from its second.

Not compiled with the PostgreSQL reader's hot path (`sources/postgres/compiled.py`): called
from it as plain Python, a change costs the same (measured on the mapping alone).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from airflow_provider_dblog.core.event import EncodedLogEvent, Event, LogOrigin, Op, Row, TableRef
from airflow_provider_dblog.core.event_codec import log_line_format
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.log import Change
from airflow_provider_dblog.core.position import Position


class TableLines:
    """The line formats of one table's row events from one source, one an operation: made
    once a table description, filled once a transaction (`in_transaction`)."""

    def __init__(self, name: str, db: str, table: TableRef) -> None:
        self.formats = {op: log_line_format(op, name, db, table) for op in _ROW_OPS}
        """Each operation's `log_line_format`: one change's line in one go."""
        self.shared = {op: _shared_format(line_format) for op, line_format in self.formats.items()}
        """Each format as a format of a transaction's (`TransactionLines`): to fill with a
        transaction's commit, txid JSON, ts_ms and schema version."""

    def in_transaction(self, commit: int, origin: LogOrigin, version: int) -> TransactionLines:
        return TransactionLines(self, commit, origin, version)

    def transaction_format(
        self, op: Op, commit: int, txid_json: bytes, ts_ms: int, version: int
    ) -> bytes:
        """The format of a change's line of `op` in the transaction of `commit`, `txid_json`
        (`LogOrigin.txid_json`) and `ts_ms`, at schema `version`: to fill with its key, before
        and after JSON and its seq. Filling it costs less than half of filling `formats`, and
        making it about as much: worth it from a transaction's second change of `op`."""
        return self.shared[op] % (commit, txid_json, ts_ms, version)


class TransactionLines:
    """One table's line formats in one transaction: its commit, `LogOrigin` and schema version
    filled in once (an operation's the first time it is met), each change's key, before and
    after JSON and seq then."""

    def __init__(self, table: TableLines, commit: int, origin: LogOrigin, version: int) -> None:
        self.table = table
        self.commit = commit
        self.origin = origin
        self.version = version
        self.formats: dict[Op, bytes] = {}

    def change(
        self,
        op: Op,
        key: Row,
        before: Row | None,
        after: Row | None,
        key_json: bytes,
        before_json: bytes,
        after_json: bytes,
        position: Position,
    ) -> Change:
        """The change of one row at `position` (of this transaction's commit), its line
        spelled from the JSON of its key and rows (`b"null"` for a missing row)."""
        line_format = self.formats.get(op) or self._format(op)
        line = line_format % (key_json, before_json, after_json, position.seq)
        origin, version = self.origin, self.version
        change: Change = _new(Change)
        _SET_EVENT(change, EncodedLogEvent(line, op, key, before, after, position, origin, version))
        return change

    def run(
        self,
        op: Op,
        first: int,
        keys: Sequence[Row],
        befores: Sequence[Row] | None,
        afters: Sequence[Row] | None,
        keys_json: Iterable[bytes],
        befores_json: Iterable[bytes],
        afters_json: Iterable[bytes],
    ) -> LogLines:
        """The changes of several rows of one operation, at seqs `first` onwards, as one
        `LogLines` (their lines spelled in one pass, no object built a row)."""
        line_format = self.formats.get(op) or self._format(op)
        seqs = range(first, first + len(keys))
        data = b"".join(
            map(line_format.__mod__, zip(keys_json, befores_json, afters_json, seqs, strict=False))
        )
        return LogLines(
            self.origin, self.version, op, self.commit, first, seqs[-1], keys, befores, afters, data
        )

    def _format(self, op: Op) -> bytes:
        origin = self.origin
        line_format = self.table.transaction_format(
            op, self.commit, origin.txid_json, origin.ts_ms, self.version
        )
        self.formats[op] = line_format
        return line_format


_ROW_OPS = (Op.CREATE, Op.UPDATE, Op.DELETE)
_PLACEHOLDER = re.compile(rb"(%%|%[bd])")
_SHARED_PLACEHOLDERS = (b"%%b", b"%%b", b"%%b", b"%d", b"%%d", b"%b", b"%d", b"%d")
"""What a transaction's format keeps of the line's placeholders (key, before and after JSON,
commit, seq, txid JSON, ts_ms, schema version): one of its own for what each change fills in,
one filled for what the transaction's changes share."""


def _shared_format(line_format: bytes) -> bytes:
    """`line_format` as a format of a transaction's format: filled with a transaction's
    commit, txid JSON, ts_ms and schema version, it gives the format of each change's key,
    before and after JSON and seq."""
    parts = _PLACEHOLDER.split(line_format)
    escaped, placeholders = [b""], iter(_SHARED_PLACEHOLDERS)
    for i, part in enumerate(parts):
        if i % 2 == 0 or part == b"%%":
            escaped[-1] += part.replace(b"%", b"%%")
        else:
            escaped += [next(placeholders), b""]
    if next(placeholders, None) is not None:
        raise ValueError(f"not a log line format of eight values: {line_format!r}")
    return b"".join(escaped)


_new = object.__new__
_SET_EVENT: Callable[[Change, Event], None] = Change.__dict__["event"].__set__
"""`Change(event)` without the frozen dataclass's `__init__`, which costs a visible share of a
log event."""
