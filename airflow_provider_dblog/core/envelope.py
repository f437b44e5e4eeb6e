"""Log row events built with their lines: the envelope every log reader writes, in one place.

A log reader spells a row change's key and rows as JSON and builds its event here. Its line is
the envelope `event_codec.log_line_format` spells for its table, filled with that JSON, its
position, and what the table's events in one transaction share (`LogOrigin`) and its schema
version; the event carries the line (`EncodedLogEvent`), which the writer thread writes as it
is. The PostgreSQL reader builds a change at a time; the binlog reader a change, or a rows
event's run of changes (`LogLines`), at a time.

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
    once a table description, filled once a change."""

    def __init__(self, name: str, db: str, table: TableRef) -> None:
        self.formats = {op: log_line_format(op, name, db, table) for op in _ROW_OPS}
        self._runs = {op: _run_format(line_format) for op, line_format in self.formats.items()}

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
        origin: LogOrigin,
        version: int,
    ) -> Change:
        """The change of one row, its line spelled from the JSON of its key and rows
        (`b"null"` for a missing row)."""
        line_format = self.formats[op]
        line = line_format % (
            key_json,
            before_json,
            after_json,
            position.commit,
            position.seq,
            origin.txid_json,
            origin.ts_ms,
            version,
        )
        change: Change = _new(Change)
        _SET_EVENT(change, EncodedLogEvent(line, op, key, before, after, position, origin, version))
        return change

    def run(
        self,
        op: Op,
        commit: int,
        first: int,
        keys: Sequence[Row],
        befores: Sequence[Row] | None,
        afters: Sequence[Row] | None,
        keys_json: Iterable[bytes],
        befores_json: Iterable[bytes],
        afters_json: Iterable[bytes],
        origin: LogOrigin,
        version: int,
    ) -> LogLines:
        """The changes of several rows of one operation, at seqs `first` onwards of `commit`,
        as one `LogLines` (their lines spelled in one pass, no object built a row): what the
        rows share filled in once, then each row's key, before, after and seq."""
        run_format = self._runs[op] % (commit, origin.txid_json, origin.ts_ms, version)
        count = len(keys)
        seqs = range(first, first + count)
        data = b"".join(
            map(run_format.__mod__, zip(keys_json, befores_json, afters_json, seqs, strict=False))
        )
        return LogLines(origin, version, op, commit, first, seqs[-1], keys, befores, afters, data)


_ROW_OPS = (Op.CREATE, Op.UPDATE, Op.DELETE)
_PLACEHOLDER = re.compile(rb"(%%|%[bd])")
_RUN_PLACEHOLDERS = (b"%%b", b"%%b", b"%%b", b"%d", b"%%d", b"%b", b"%d", b"%d")
"""What a run's format keeps of the line's placeholders (key, before and after JSON, commit,
seq, txid JSON, ts_ms, schema version): a placeholder of the run's format for what each row
fills in, one of its own for what the rows share."""


def _run_format(line_format: bytes) -> bytes:
    """`line_format` as a format of a run's format: filled with a run's commit, txid JSON,
    ts_ms and schema version, it gives the format of each row's key, before and after JSON
    and seq."""
    parts = _PLACEHOLDER.split(line_format)
    escaped, placeholders = [b""], iter(_RUN_PLACEHOLDERS)
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
