"""The Redis state: what the dump, the tailer and Airflow share about one source.

The dump (Spark job or CLI) and the log tailer never talk to each other; they meet here. One
store per concern, each over the keys `keys.py` spells for a source:

- `WindowStore` (windows.py): watermark windows and their chunk rows, the dump's and the
  tailer's meeting point;
- `DirectWindowStore` (direct.py): what the tailer records at a direct window's hw, and the
  direct windows whose rows are not yet committed (the tombstone horizon);
- `PositionalWindowStore` (positional.py): read-only windows, whose watermarks are log
  positions the tailer arms and closes them at;
- `DumpStore` (dumps.py): dump requests, their status, counters, progress, controls and the
  beat of the process running them, written by Airflow, the CLI and the dump;
- `VerifyStore` (verifies.py): verify runs, their progress, counts per table and differing
  keys;
- `TailerStore` (tailer.py): the tailer's lease and fencing token, checkpoint and heartbeat;
- `CompactorStore` (compactor.py): the compaction follower's lease, fencing token and
  heartbeat (`lease.Lease` is the lease both services hold);
- `StateStore` (store.py): the seven on one client, for callers that need several;
- `AsyncStateReader` (async_reader.py): what Airflow's triggers poll, on redis.asyncio;
- `RedisSettings` (connection.py): how every process reaches the store (one server, or the
  primary Redis Sentinel names; TLS; an ACL user), and acl.py: each role's least ACL rules.

Every check-then-write that two processes may race on is one Lua script, beside the method that
calls it. Timestamps written by scripts come from the Redis server clock (TIME), so the dump,
the tailer and Airflow on different hosts compare them on one clock.

Durability. Redis runs with `appendonly yes` and `appendfsync everysec`: a crash of Redis (or of
its host) can lose the writes of the last second or so. The AOF is a log, so what is lost is
always a suffix of the writes: a later write never survives an earlier one. What that costs,
per kind of key, is told in the docstring of the store that owns the key.

A Redis that cannot be reached raises `StateStoreUnavailable` (wrapping redis-py's
ConnectionError / TimeoutError) from every method, and one that answers but refuses writes (full,
a replica, unable to save) its subclass `StateStoreRefusesWrites`: callers wait both out alike.
Nothing is retried here beyond what the client's own retry policy does.
"""

from airflow_provider_dblog.state.async_reader import AsyncStateReader
from airflow_provider_dblog.state.compactor import CompactorHealth, CompactorStore
from airflow_provider_dblog.state.direct import DirectWindowStore
from airflow_provider_dblog.state.dumps import (
    DumpControls,
    DumpState,
    DumpStatus,
    DumpStore,
    StoredDump,
)
from airflow_provider_dblog.state.errors import (
    AlreadyExists,
    FencedOut,
    MissingRows,
    StateStoreError,
    StateStoreRefusesWrites,
    StateStoreUnavailable,
    UnknownDump,
    UnknownWindow,
)
from airflow_provider_dblog.state.keys import SourceKeys
from airflow_provider_dblog.state.positional import PendingWindow, PositionalWindowStore
from airflow_provider_dblog.state.store import StateStore
from airflow_provider_dblog.state.tailer import TablesChange, TailerHealth, TailerStore
from airflow_provider_dblog.state.verifies import (
    FoundDifference,
    VerifyState,
    VerifyStatus,
    VerifyStore,
)
from airflow_provider_dblog.state.window_rows import StoredRows
from airflow_provider_dblog.state.windows import (
    Mark,
    WindowState,
    WindowStatus,
    WindowStore,
)

__all__ = [
    "AlreadyExists",
    "AsyncStateReader",
    "CompactorHealth",
    "CompactorStore",
    "DirectWindowStore",
    "DumpControls",
    "DumpState",
    "DumpStatus",
    "DumpStore",
    "FencedOut",
    "FoundDifference",
    "Mark",
    "MissingRows",
    "PendingWindow",
    "PositionalWindowStore",
    "SourceKeys",
    "StateStore",
    "StateStoreError",
    "StateStoreRefusesWrites",
    "StateStoreUnavailable",
    "StoredDump",
    "StoredRows",
    "TablesChange",
    "TailerHealth",
    "TailerStore",
    "UnknownDump",
    "UnknownWindow",
    "VerifyState",
    "VerifyStatus",
    "VerifyStore",
    "WindowState",
    "WindowStatus",
    "WindowStore",
]
