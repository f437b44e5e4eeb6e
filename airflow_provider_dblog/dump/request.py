"""A validated dump request from what a person gave: table names, a key list, sizes.

Shared by `dblog dump` and the Airflow operators, so both refuse the same bad input with the
same message, before anything is stored or submitted. What only the database can judge is
asked of it here too, through the source's `ChunkSource`: that it is set up for dumps
(`check_ready`), that the tables exist with a primary key (`key_columns`), that every key
value is one its column's type accepts (`check_keys`, which also normalises the keys), and that
a filter is one condition on the table's own columns (`check_filter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, coerce_keys, parse_keys
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.direct_target import check_direct_target, default_mode
from airflow_provider_dblog.sources.base import ChunkSource


def captured_tables(config: Config, tables: Sequence[str] | None) -> tuple[TableRef, ...]:
    """The tables named (all captured tables if None), each checked to be captured."""
    if tables is None:
        return config.source.tables
    if isinstance(tables, str) or not tables:
        raise InvalidRequest(f"tables must be a non-empty list of 'schema.table', got {tables!r}")
    refs = []
    for name in tables:
        try:
            ref = TableRef.parse(name, default_schema="public")
        except (ValueError, AttributeError):
            raise InvalidRequest(f"{name!r} is not a table name ('schema.table')") from None
        if ref not in config.source.tables:
            captured = ", ".join(str(t) for t in config.source.tables)
            raise InvalidRequest(
                f"table {ref} is not captured by source {config.source.name}: "
                f"the captured tables are {captured}"
            )
        refs.append(ref)
    return tuple(refs)


DEFAULT_CHUNK_SIZE: Final[Mapping[DumpMode, int]] = {
    DumpMode.SEQUENCED: 10_000,
    DumpMode.DIRECT: 100_000,
}
"""Rows a chunk of a dump on Spark when the request does not say. A sequenced chunk's rows all
pass the tailer at its hw, where log events wait behind them; a Spark job costs about 135 ms
whatever its size. A direct chunk adds a commit a chunk and never reaches the tailer: larger
spreads those costs over more rows."""

IN_PROCESS_CHUNK_SIZE: Final[Mapping[DumpMode, int]] = {
    DumpMode.SEQUENCED: 1000,
    DumpMode.DIRECT: 100_000,
}
"""The same for `dblog dump`, which reads in its own process: a sequenced chunk there costs a
few watermark writes and Redis calls, so small chunks keep the log's wait at hw short."""


def build_request(
    config: Config,
    source: ChunkSource,
    *,
    dump_id: str,
    tables: Sequence[str] | None,
    keys: str | Sequence[object] | None,
    chunk_size: int | None,
    parallelism: int,
    mode: str | None = None,
    where: str | None = None,
    default_chunk_sizes: Mapping[DumpMode, int] = DEFAULT_CHUNK_SIZE,
) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
    """A validated request and the tables' key columns. `keys` (text as `dblog dump --keys`
    takes it, or already-parsed JSON values) needs exactly one table. Unknown tables, tables
    without a primary key, malformed keys, key values their column's type refuses and a source
    no tailer has set up are refused here with a message naming them; the keys come back as
    the source normalised them (`"7"` on an integer key is 7). `mode` (None: the deployment's
    default, see `direct_target.py`) must be one the deployment's target takes; a
    `chunk_size` of None is the mode's in `default_chunk_sizes`. `where` (None or blank: no
    filter) dumps only the rows of one named table that match it, checked by the source."""
    dump_mode = default_mode(config) if mode is None else DumpMode.parse(mode)
    if dump_mode is DumpMode.DIRECT:
        check_direct_target(config)
    refs = captured_tables(config, tables)
    if keys is not None and len(refs) != 1:
        raise InvalidRequest(f"keys need exactly one table, got {len(refs)}")
    where = where if where is None or where.strip() else None
    if where is not None and (tables is None or len(refs) != 1 or keys is not None):
        raise InvalidRequest(
            "a filter (where) needs exactly one table and no keys: it narrows a dump of one table"
        )
    key_columns = {t: source.key_columns(t) for t in refs}
    parsed: tuple[Key, ...] = ()
    if isinstance(keys, str):
        parsed = parse_keys(keys, key_columns[refs[0]], refs[0])
    elif keys is not None:
        if not isinstance(keys, Sequence):
            raise InvalidRequest(f"keys must be a list or text, got {keys!r}")
        parsed = coerce_keys(list(keys), key_columns[refs[0]], refs[0])
    if parsed:
        parsed = source.check_keys(refs[0], parsed)
    if where is not None:
        where = source.check_filter(refs[0], where)
    source.check_ready()
    if source.read_only and dump_mode is DumpMode.DIRECT:
        raise InvalidRequest(
            "the source is read-only: its dumps are sequenced (a direct dump's windows need "
            "watermarks written into the source); dump with mode 'sequenced'"
        )
    if keys is not None:
        kind = DumpKind.KEYS
    elif tables is None:
        kind = DumpKind.ALL
    else:
        kind = DumpKind.TABLE if len(refs) == 1 else DumpKind.ALL
    if chunk_size is None:
        chunk_size = default_chunk_sizes[dump_mode]
    request = DumpRequest(dump_id, kind, refs, parsed, chunk_size, parallelism, dump_mode, where)
    return request, key_columns
