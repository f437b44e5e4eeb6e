"""Repair only what differs: a finished verify run's differing keys put right, and no other key
written.

A key dump (`dump/`) re-sends each key's row as the source holds it at the dump's hw,
sequenced or direct as the deployment's target takes dumps (`direct_target.default_mode`):
that repairs a key missing from the target and a changed one. It cannot remove a key the
target has and the source has not: a dump sends rows, and the source has none for it.

So each table's differing keys are first checked again, as a verify chunk checks a key list
(`chunk.verify_chunk`), and inside that chunk's outer window, right after the target's read,
the keys the target holds and the source read did not are removed from the target
(`KeyRemover`). A removed key that the log did not change while the window was open was absent
from the source all along: the target had applied every event of it before the removal (it
had applied the log through hw) and meets the next only after the window closed, so removing
it was exact. Every other differing key goes into the key dump, a removed key the log did
change among them (a newer row may have gone with it): a key the source holds at the dump's
hw is re-sent, and one it does not hold is absent from the target too, its delete being in
the log before hw.

The dumps are stored and recorded on the run (`VerifyStore.repair_started`) before they run,
one a table, with ids `<verify id>-repair-<n>` (n: the table's place in the request): a repair
that dies resumes its dumps, and a table whose dump was stored before the death is not checked
again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.dump.request import IN_PROCESS_CHUNK_SIZE, build_request
from airflow_provider_dblog.outputs.sql_apply.remove import TargetKeys
from airflow_provider_dblog.outputs.sql_apply.target import TableMap
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.request import VerifyRequest
from airflow_provider_dblog.verify.runner import verify_with_retries
from airflow_provider_dblog.verify.targets import check_target

REPAIRS = ("none", "auto")
"""What a verify run does with the keys it found differing: nothing, or repair them."""


class KeyRemover(Protocol):
    """Removes keys of a source table from a target."""

    def remove(self, table: TableRef, keys: Sequence[Key]) -> int:
        """Remove the rows of `keys` of `table` from the target; the rows removed."""
        ...

    def close(self) -> None: ...


def key_remover_for(config: Config, target: str) -> KeyRemover:
    """The remover of `target`'s extra keys, connected; refused in one line where a repair
    cannot remove keys."""
    check_target(config, target)
    options = config.output
    if target != "output" or options.get("type") != "sql_apply":
        raise InvalidRequest(
            f"a repair removes extra keys from the sql_apply output only, not from {target}: "
            "verify it with --repair none"
        )
    return TargetKeys(
        os.environ[str(options["dsn_env"])],
        TableMap(options.get("table_map")).target_of,
        connect_timeout=int(options.get("connect_timeout", 10)),
    )


@dataclass(frozen=True)
class Repair:
    removed: int
    """Keys removed from the target, each checked absent from the source while it was."""
    dumps: tuple[str, ...]
    """The key dumps that re-send the other differing keys, stored, to run."""


def repair_dump_id(verify_id: str, table_index: int) -> str:
    return f"{verify_id}-repair-{table_index}"


def prepare_repair(
    store: StateStore,
    config: Config,
    source: ChunkSource,
    target: TargetReader,
    remover: KeyRemover,
    request: VerifyRequest,
    *,
    window_timeout_s: float,
) -> Repair:
    """Remove the run's extra keys from the target where that is exact, store a key dump of
    its other differing keys per table, and record both on the run (see the module
    docstring); the repair recorded before, if the run has one. `ChunkGaveUp` when a check's
    windows keep failing: nothing is recorded, and the repair can be run again."""
    verify_id = request.verify_id
    status = store.verifies.status(verify_id)
    if status is not None and status.repair_dumps is not None:
        return Repair(status.removed, status.repair_dumps)
    differing: dict[TableRef, list[Key]] = {}
    for found in store.verifies.differences(verify_id):
        differing.setdefault(found.table, []).append(found.key)
    removed = 0
    dumps: list[str] = []
    for index, table in enumerate(request.tables):
        keys = differing.get(table)
        if not keys:
            continue
        dump_id = repair_dump_id(verify_id, index)
        if store.dumps.get(dump_id) is None:
            exact = _remove_extra(store, source, target, remover, request, table, keys,
                                  window_timeout_s)  # fmt: skip
            removed += len(exact)
            resend = [list(key) for key in keys if key not in exact]
            if not resend:
                continue
            dump, key_columns = build_request(
                config,
                source,
                dump_id=dump_id,
                tables=[str(table)],
                keys=resend,
                chunk_size=None,
                parallelism=1,
                default_chunk_sizes=IN_PROCESS_CHUNK_SIZE,
            )
            store.dumps.create(dump, key_columns)
        dumps.append(dump_id)
    store.verifies.repair_started(verify_id, removed, dumps)
    return Repair(removed, tuple(dumps))


def _remove_extra(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    remover: KeyRemover,
    request: VerifyRequest,
    table: TableRef,
    keys: list[Key],
    window_timeout_s: float,
) -> set[Key]:
    """Check `keys` again a key list at a time, removing from the target those it holds and
    the source read did not, inside each chunk's outer window; the removed keys the log did
    not change while it was open (the removals known exact)."""
    exact: set[Key] = set()

    def remove_extra(source_rows: dict[Key, str], target_rows: dict[Key, str]) -> None:
        remover.remove(table, [key for key in target_rows if key not in source_rows])

    for start in range(0, len(keys), request.chunk_size):
        chunk = Chunk(table, start, keys=tuple(keys[start : start + request.chunk_size]))
        verified = verify_with_retries(
            store, source, target, request, chunk, window_timeout_s, remove_extra
        )
        exact.update(k for k, kind in verified.differences if kind is Difference.EXTRA)
    return exact
