"""A validated dump request from what a person gave: table names, a key list, sizes.

Shared by `dblog dump` and the Airflow operators, so both refuse the same bad input with the
same message, before anything is stored or submitted, naming every problem found at once
(`Problems`): a person fixes the request in one go, not one refusal at a time. What only the
database can judge is asked of it here too, through the source's `ChunkSource`: that it is
set up for dumps (`check_ready`), that the tables exist with a primary key (`key_columns`),
that every key value is one its column's type accepts (`check_keys`, which also normalises
the keys), and that a filter is one condition on the table's own columns (`check_filter`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Final, TypeVar

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import (
    DumpKind,
    DumpRequest,
    key_items,
    listed,
    shaped_keys,
)
from airflow_provider_dblog.core.errors import DBLogError, InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.direct_target import check_direct_target, default_mode
from airflow_provider_dblog.sources.base import ChunkSource, InvalidKey, SourceError

T = TypeVar("T")


def captured_tables(config: Config, tables: Sequence[str] | None) -> tuple[TableRef, ...]:
    """The tables named (all captured tables if None), each checked to be captured."""
    if tables is None:
        return config.source.tables
    if isinstance(tables, str) or not tables:
        raise InvalidRequest(f"tables must be a non-empty list of 'schema.table', got {tables!r}")
    refs: list[TableRef] = []
    unknown: list[TableRef] = []
    malformed: list[str] = []
    for name in tables:
        try:
            ref = TableRef.parse(name, default_schema="public")
        except (ValueError, AttributeError):
            malformed.append(repr(name))
            continue
        (refs if ref in config.source.tables else unknown).append(ref)
    problems = []
    if malformed:
        problems.append(f"not a table name ('schema.table'): {', '.join(malformed)}")
    if unknown:
        captured = ", ".join(str(t) for t in config.source.tables)
        named = ", ".join(str(t) for t in unknown)
        are = "table {} is" if len(unknown) == 1 else "tables {} are"
        problems.append(
            f"{are.format(named)} not captured by source {config.source.name}: "
            f"the captured tables are {captured}"
        )
    if problems:
        raise InvalidRequest("; ".join(problems))
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


class Problems:
    """What is wrong with a request, gathered across its independent checks so that a person
    fixes them all at once: the table names, the keys, the filter, the mode, the source."""

    def __init__(self) -> None:
        self._found: list[DBLogError] = []

    def add(self, problem: DBLogError) -> None:
        self._found.append(problem)

    def check(self, step: Callable[[], T]) -> T | None:
        """`step`'s result, or None when it refuses the request (kept for `raise_any`). A
        source out of reach is no problem of the request: it is raised at once."""
        try:
            return step()
        except (InvalidRequest, SourceError) as problem:
            self._found.append(problem)
            return None

    def raise_any(self) -> None:
        """The one problem found as it was raised, or all of them in one `InvalidRequest`."""
        if len(self._found) == 1:
            raise self._found[0]
        if self._found:
            raise InvalidRequest(listed([str(p) for p in self._found]))


def checked_keys(
    source: ChunkSource, table: TableRef, keys: str | Sequence[object], columns: tuple[str, ...]
) -> tuple[Key, ...]:
    """`keys` (text as `dblog dump --keys` takes it, or parsed JSON values) as the source
    normalised them. Every bad key is named in one refusal: those that do not fit the key's
    columns and those with a value its column's type refuses."""
    if isinstance(keys, str):
        items = key_items(keys, columns, table, lambda: source.max_key(table))
    elif isinstance(keys, Sequence):
        items = list(keys)
    else:
        raise InvalidRequest(f"keys must be a list or text, got {keys!r}")
    shaped, problems = shaped_keys(items, columns, table)
    normalised: tuple[Key, ...] = ()
    try:
        normalised = source.check_keys(table, list(shaped.values()))
    except InvalidKey:
        problems.update(_refused_keys(source, table, list(shaped.items())))
    if problems:
        raise InvalidRequest(listed([problems[n] for n in sorted(problems)]))
    return normalised


def _refused_keys(
    source: ChunkSource, table: TableRef, keys: list[tuple[int, Key]]
) -> dict[int, str]:
    """Each of the numbered `keys` that has a value the source refuses, with its reason. The
    source names only the first value it refuses in a list: the list is checked by halves,
    so a few bad keys among many cost a few queries."""
    try:
        source.check_keys(table, [key for _, key in keys])
    except InvalidKey as refusal:
        if len(keys) == 1:
            ((number, _),) = keys
            return {number: f"key #{number}: {refusal}"}
        half = len(keys) // 2
        return {
            **_refused_keys(source, table, keys[:half]),
            **_refused_keys(source, table, keys[half:]),
        }
    return {}


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
    filter) dumps only the rows of one named table that match it, checked by the source. The
    request is read-only when `source` writes nothing (`Source.chunk_source(read_only=True)`,
    or a `[source] read_only` source): it is then checked as such (`check_ready`: MySQL
    cannot), and sequenced."""
    problems = Problems()
    read_only = source.read_only
    dump_mode: DumpMode | None = DumpMode.SEQUENCED if read_only else default_mode(config)
    if mode is not None:
        dump_mode = problems.check(partial(DumpMode.parse, mode))
    if dump_mode is DumpMode.DIRECT:
        problems.check(lambda: check_direct_target(config))
    refs = problems.check(lambda: captured_tables(config, tables))
    where = where if where is None or where.strip() else None
    key_columns: dict[TableRef, tuple[str, ...]] = {}
    parsed: tuple[Key, ...] = ()
    if refs is not None:
        if keys is not None and len(refs) != 1:
            problems.add(InvalidRequest(f"keys need exactly one table, got {len(refs)}"))
        if where is not None and (tables is None or len(refs) != 1 or keys is not None):
            problems.add(
                InvalidRequest(
                    "a filter (where) needs exactly one table and no keys: it narrows a dump of "
                    "one table"
                )
            )
        for ref in refs:
            columns = problems.check(partial(source.key_columns, ref))
            if columns is not None:
                key_columns[ref] = columns
        if len(refs) == 1 and refs[0] in key_columns:
            table = refs[0]
            if keys is not None:
                check = partial(checked_keys, source, table, keys, key_columns[table])
                parsed = problems.check(check) or ()
            elif where is not None:
                where = problems.check(partial(source.check_filter, table, where))
    problems.check(source.check_ready)
    if read_only and dump_mode is DumpMode.DIRECT:
        what = "a read-only dump is"
        if config.source.read_only:
            what = "the source is read-only: its dumps are"
        problems.add(
            InvalidRequest(
                f"{what} sequenced (a direct dump's windows need watermarks written into the "
                "source); dump with mode 'sequenced'"
            )
        )
    problems.raise_any()
    assert dump_mode is not None and refs is not None
    if keys is not None:
        kind = DumpKind.KEYS
    elif tables is None:
        kind = DumpKind.ALL
    else:
        kind = DumpKind.TABLE if len(refs) == 1 else DumpKind.ALL
    if chunk_size is None:
        chunk_size = default_chunk_sizes[dump_mode]
    request = DumpRequest(
        dump_id, kind, refs, parsed, chunk_size, parallelism, dump_mode, where, read_only
    )
    return request, key_columns
