"""Where a source's state lives in Redis: every key, spelled in this one place.

Keys (P = `dblog:{<source>}:`; the braces are literal: they make P a Redis Cluster hash tag, so
every key of a source lives in one slot and every Lua script of the stores may touch any of them):

| key                    | type   | meaning                                                     |
|------------------------|--------|-------------------------------------------------------------|
| P window:<id>          | hash   | a watermark window: window_id, dump_id, table, lw, hw,      |
|                        |        | chunk (JSON), state, reason, registered_ms, updated_ms      |
| P wm:<value>           | string | the window a watermark value belongs to: JSON {window_id,   |
|                        |        | dump_id, table, mark: "lw" or "hw"}                         |
| P window:<id>:rows     | list   | the chunk rows as readers encoded them, a page (up to 1000  |
|                        |        | rows or ~1 MiB) in two elements: its rows' key JSON, then   |
|                        |        | their values' JSON, each joined by newlines                 |
| P window:<id>:rowsmeta | hash   | key_columns, invisible_txids (JSON), rows, format; the JSON |
|                        |        | column lists of part n in columns:<n>; appended rows add    |
|                        |        | part:<n> (its row count) and invisible_txids:<n> (JSON)     |
| P window:<id>:ended    | list   | one element once the window ended (waiters block on it)     |
| P direct:pending       | hash   | window id -> its lw position (JSON), for each direct window |
|                        |        | the tailer recorded whose rows are not yet committed        |
| P window:<id>:armed    | list   | one element once the tailer armed a read-only window        |
| P positional           | set    | the ids of the read-only windows not yet seen ended         |
| P positional:last      | string | "<commit> <seq>": the last position the tailer gave a       |
|                        |        | read-only window's rows, so none is given twice             |
| P positional:wake      | pubsub | a dump publishes when it adds a read-only window or makes   |
|                        |        | one ready: the tailer looks at once, not at its next poll   |
| P dumps                | list   | dump ids in the order they were created                     |
| P dump:<id>            | string | the DumpRequest but its chunk_size, the tables' key columns |
| P dump:<id>:status     | hash   | state, reason, chunks, rows, windows_retried,               |
|                        |        | created_ms, started_ms, finished_ms, updated_ms             |
| P dump:<id>:controls   | hash   | paused, cancelled, chunk_size, delay_ms, max_rows_per_s     |
| P dump:<id>:progress   | hash   | table ("schema.name") -> TableProgress JSON                 |
| P dump:<id>:driver     | string | the process running the dump; expires (PX) unless renewed   |
| P dump:<id>:origin     | string | the Airflow task that asked for the dump: JSON {dag_id,     |
|                        |        | run_id, task_id, map_index, run_url, task_url}              |
| P tailer:checkpoint    | string | the commit position the tailer restarts from                |
| P tailer:resume        | string | where the source's log reader resumes, saved with the       |
|                        |        | checkpoint (opaque to all but the reader; absent when the   |
|                        |        | source keeps it, as PostgreSQL's slot does)                 |
| P tailer:token         | string | the last fencing token handed out                           |
| P tailer:lease         | hash   | owner, token of the active tailer; expires (PX)             |
| P tailer:heartbeat     | hash   | owner, at_ms (Redis clock), metrics (JSON); expires (PX)    |
| P tailer:schemas       | hash   | table ("schema.name") -> its durable schema events a        |
|                        |        | replay from the checkpoint can meet, oldest first: JSON     |
|                        |        | [{version, schema, position}, ...]                          |
| P tailer:tables        | list   | changes of the captured tables a running tailer took, the   |
|                        |        | newest first (the last 20): JSON {at_ms, owner, added,      |
|                        |        | removed}                                                    |
| P verifies             | list   | verify run ids in the order they were created               |
| P verify:<id>          | string | the verify request (JSON)                                   |
| P verify:<id>:status   | hash   | state, reason, chunks, windows_retried, created_ms,         |
|                        |        | finished_ms, updated_ms                                     |
| P verify:<id>:progress | hash   | table ("schema.name") -> where its verify stands (JSON)     |
| P verify:<id>:counts   | hash   | "<table> <counter>" -> count (checked, in_flux, missing,    |
|                        |        | extra, changed)                                             |
| P verify:<id>:diffs    | list   | every differing key found: JSON [table, kind, key values]   |
| P verify:<id>:runner   | string | the process running the verify; expires (PX) unless renewed |
| P verify:<id>:controls | hash   | a dump's controls: paused, cancelled, chunk_size, delay_ms, |
|                        |        | max_rows_per_s                                              |
| P compact:token        | string | the last fencing token the compaction's lease handed out    |
| P compact:lease        | hash   | owner, token of the folding `dblog lake compact --follow`;  |
|                        |        | expires (PX)                                                |
| P compact:heartbeat    | hash   | owner, at_ms (Redis clock), metrics (JSON); expires (PX)    |

A read-only window's hash also holds `armed_at`, the commit position the tailer armed it at
(it had read every commit below it), and `ready` once its rows are stored; its rowsmeta holds
`hw` (every commit the reads saw is below it) and, when the reads can tell, `snapshot_end`
(they saw every commit below it).

A direct window's hash also holds, once the tailer recorded it at hw, lw_position and
hw_position (JSON) and changed (the JSON list of the keys that changed inside it).

The window keys belong to `WindowStore` (windows.py), except what direct windows add, which
belongs to `DirectWindowStore` (direct.py), and what read-only windows add, which belongs to
`PositionalWindowStore` (positional.py); the dump keys to `DumpStore` (dumps.py),
the verify keys to `VerifyStore` (verifies.py),
the tailer keys to `TailerStore` (tailer.py), the compaction keys to `CompactorStore`
(compactor.py); `AsyncStateReader` reads some of the tailer and dump keys.
"""

from __future__ import annotations

import re

from airflow_provider_dblog.core.errors import InvalidRequest

_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class SourceKeys:
    """The keys of one source (see the table above), its name checked once."""

    __slots__ = (
        "compact_heartbeat",
        "compact_lease",
        "compact_token",
        "direct_pending",
        "dumps",
        "positional",
        "positional_last",
        "positional_wake",
        "prefix",
        "source",
        "tailer_checkpoint",
        "tailer_heartbeat",
        "tailer_lease",
        "tailer_resume",
        "tailer_schemas",
        "tailer_tables",
        "tailer_token",
        "verifies",
    )

    def __init__(self, source: str) -> None:
        if not _SOURCE_NAME.fullmatch(source):
            raise InvalidRequest(
                f"a source name is letters, digits, '_', '.' and '-', got {source!r}"
            )
        self.source = source
        self.prefix = f"dblog:{{{source}}}:"
        self.dumps = self.prefix + "dumps"
        self.verifies = self.prefix + "verifies"
        self.direct_pending = self.prefix + "direct:pending"
        self.positional = self.prefix + "positional"
        self.positional_last = self.prefix + "positional:last"
        self.positional_wake = self.prefix + "positional:wake"
        self.tailer_checkpoint = self.prefix + "tailer:checkpoint"
        self.tailer_resume = self.prefix + "tailer:resume"
        self.tailer_token = self.prefix + "tailer:token"
        self.tailer_lease = self.prefix + "tailer:lease"
        self.tailer_heartbeat = self.prefix + "tailer:heartbeat"
        self.tailer_schemas = self.prefix + "tailer:schemas"
        self.tailer_tables = self.prefix + "tailer:tables"
        self.compact_token = self.prefix + "compact:token"
        self.compact_lease = self.prefix + "compact:lease"
        self.compact_heartbeat = self.prefix + "compact:heartbeat"

    def window(self, window_id: str) -> str:
        return f"{self.prefix}window:{window_id}"

    def window_rows(self, window_id: str) -> str:
        return self.window(window_id) + ":rows"

    def window_rows_meta(self, window_id: str) -> str:
        return self.window(window_id) + ":rowsmeta"

    def window_ended(self, window_id: str) -> str:
        return self.window(window_id) + ":ended"

    def window_armed(self, window_id: str) -> str:
        return self.window(window_id) + ":armed"

    def watermark(self, value: str) -> str:
        return f"{self.prefix}wm:{value}"

    def dump(self, dump_id: str) -> str:
        return f"{self.prefix}dump:{dump_id}"

    def dump_status(self, dump_id: str) -> str:
        return self.dump(dump_id) + ":status"

    def dump_controls(self, dump_id: str) -> str:
        return self.dump(dump_id) + ":controls"

    def dump_progress(self, dump_id: str) -> str:
        return self.dump(dump_id) + ":progress"

    def dump_driver(self, dump_id: str) -> str:
        return self.dump(dump_id) + ":driver"

    def dump_origin(self, dump_id: str) -> str:
        return self.dump(dump_id) + ":origin"

    def verify(self, verify_id: str) -> str:
        return f"{self.prefix}verify:{verify_id}"

    def verify_part(self, verify_id: str, part: str) -> str:
        """`status`, `controls`, `progress`, `counts`, `diffs` or `runner` of a verify run."""
        return f"{self.verify(verify_id)}:{part}"
