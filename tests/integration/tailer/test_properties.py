"""The generated histories of tests/unit/histories.py, played against the production tailer.

The production `Session` (reconciler, writer thread, window moves, acknowledgements) reads a
scripted log (`ScriptedLog`: the model source's log as `LogItem`s) and writes an in-memory
output that can hold the writer's batch (`HoldingOutput`), with a real Redis as its state store:
the dumps register windows, store rows and abandon them through the real `WindowStore`, so the
claim/abandon race runs the production Lua scripts. `Session` rather than `Tailer`: the lease
loop adds only backoff waits, and each restart here is what `Tailer` does after a session ends,
a new `Session` with a reader from the last acknowledged position. Chunks are read by the
history's `Dump`, not `dump/chunk.py`'s `run_chunk`, which blocks until its window ends.

Each history runs the session in a thread of its own, in lock step with the history: every
command (feed some log entries, expire windows, end the session) runs inside the reader's
`items()`, and the history waits until the session asks for its next item. After every feed the
reader yields `Idle` until everything handed over is acknowledged, so window states and
acknowledged positions are the same on every run, as Hypothesis needs; while the output holds,
until the writer is stuck in it; at the log's end that `Idle` is the log's end. `batch_events =
1` makes the writer take one item at a time, so which marks a held batch keeps back does not
depend on timing, and the session looks for read-only windows at every commit boundary
(`_POSITIONAL_POLL_S` is 0 here), not every so often, so where it arms and closes them does not
either.

Half the model's examples (`DBLOG_PROPERTY_EXAMPLES` / 2): each costs a thread per session
and a few hundred Redis calls.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from unittest import mock

import pytest
import redis
from hypothesis import HealthCheck, given, settings

from airflow_provider_dblog.core.event import Event, TableRef
from airflow_provider_dblog.core.log import Idle, LogItem
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    Opened,
    Reconciler,
    Window,
)
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs.base import Output, OutputUnavailable
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import session as session_module
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.session import Leadership, Session
from airflow_provider_dblog.tailer.settings import TailerSettings
from tests.unit.broken_reconcilers import BROKEN_RECONCILERS
from tests.unit.histories import History, histories, mutant_search, run_history
from tests.unit.simulation import DB, SOURCE_NAME, ReplayDroppingOutput, Source, log_items

EXAMPLES = max(1, int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000")) // 2)
MUTANT_EXAMPLES = 4000
REDIS_DB = 15
"""A database of its own: every history starts from an empty one."""
COMMAND_TIMEOUT_S = 30.0
"""A session that does not answer a command within this is stuck: the history fails."""

SETTINGS = TailerSettings(
    batch_events=1,
    checkpoint_s=0.0,  # acknowledge what is durable at once: the histories follow every ack
    heartbeat_s=3600.0,  # housekeeping (lease, expiry) runs at a session's start and on Expire
    window_ttl_s=3600.0,
    lease_ttl_ms=3_600_000,
    writer_stop_s=10.0,
)


class RedisWindows:
    """The dump's side of `WindowStore`, as the histories' `Dump` calls it."""

    def __init__(self, store: StateStore) -> None:
        self._windows = store.windows
        self._positional = store.positional

    def register(self, window: Window, lw: str, hw: str) -> None:
        self._windows.register(window, lw, hw, {}, ttl_s=3600)

    def put_rows(self, window_id: str, chunk: ChunkRows) -> bool:
        return self._windows.put_rows(window_id, chunk)

    def state(self, window_id: str) -> str:
        status = self._windows.state(window_id)
        assert status is not None, f"window {window_id} vanished"
        return status.state.value

    def abandon(self, window_id: str) -> bool:
        return self._windows.abandon(window_id)

    def add_positional(self, window_id: str) -> None:
        self._positional.add(window_id)

    def ready(self, window_id: str) -> bool:
        return self._positional.ready(window_id)


class HoldingOutput(Output):
    """Takes batches into a `ReplayDroppingOutput`. While held, a write waits (the writer is
    stuck in the output, nothing it holds is durable); `abort` makes it fail as a connection
    lost mid-batch does, so the ending session's writer stops with nothing written."""

    def __init__(self) -> None:
        self.taken = ReplayDroppingOutput()
        self._mode = "pass"
        self._changed = threading.Condition()
        self.blocked = False

    def write(self, events: Sequence[Event], token: int) -> None:
        with self._changed:
            while self._mode == "hold":
                self.blocked = True
                self._changed.wait()
            self.blocked = False
            if self._mode == "abort":
                raise OutputUnavailable("the output went away mid-batch")
            self.taken.take(list(events))

    def set_mode(self, mode: str) -> None:
        with self._changed:
            self._mode = mode
            self._changed.notify_all()

    @property
    def held(self) -> bool:
        return self._mode == "hold"

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Feed:
    items: list[LogItem]
    handed: int
    """The commit of the last transaction handed over so far in this session."""
    end: int
    """What the `Idle`s after the items say: the log's end once every entry is fed."""


@dataclass(frozen=True)
class _Call:
    action: Callable[[], None]


@dataclass(frozen=True)
class _End:
    abort: bool
    """End with the writer's batch lost (it is stuck in the held output)."""


_Command = _Feed | _Call | _End


class _Aborted(Exception):
    """The session ends with what its writer holds lost, as when the process dies."""


class ScriptedLog:
    """A `LogReader` whose items come from the history, one command at a time: it runs each
    command in the session's thread and reports back once the session asks for more."""

    def __init__(self, output: HoldingOutput, source: Source) -> None:
        self._output = output
        self._source = source
        self.commands: queue.Queue[_Command] = queue.Queue()
        self.done: queue.Queue[BaseException | None] = queue.Queue()
        self.acknowledged = 0

    def items(self) -> Iterator[LogItem]:
        while True:
            command = self.commands.get()
            if isinstance(command, _End):
                if command.abort:
                    raise _Aborted
                return
            if isinstance(command, _Call):
                command.action()
            else:
                yield from command.items
                yield from self._settle(command.handed, command.end)
            self.done.put(None)

    def _settle(self, handed: int, end: int) -> Iterator[LogItem]:
        """Until everything handed over is acknowledged, or the writer is stuck in the held
        output; the last `Idle` lets the session acknowledge what became durable before."""
        while True:
            settled = self.acknowledged >= handed or (self._output.held and self._output.blocked)
            if not settled:
                time.sleep(0.0001)  # the writer thread's turn
            yield Idle(end)
            if settled:
                return

    def acknowledge(self, commit: int) -> None:
        self.acknowledged = max(self.acknowledged, commit)

    def describe(self, table: TableRef) -> TableSchema:
        raise AssertionError(f"{table} was never described, so its catalog is never asked")

    def log_end(self) -> int:
        return self._source.log_end

    def close(self) -> None:
        pass


class SessionDriver:
    """Drives production `Session`s through a history: the `TailerDriver` of histories.py."""

    def __init__(
        self, source: Source, store: StateStore, reconciler_class: type[Reconciler]
    ) -> None:
        self.source = source
        self._store = store
        self._reconciler_class = reconciler_class
        self._output = HoldingOutput()
        token = store.tailer.acquire_lease("property", SETTINGS.lease_ttl_ms)
        assert token is not None
        self._leadership = Leadership("property", token)
        self.lost_batches = 0
        self.bounds: dict[str, tuple[int, int]] = {}
        """Each window closed, as the session opened and closed it in its reconciler."""
        self._acks = [0]
        """The source's acknowledged position after each command: where a restart reads from."""
        self._thread: threading.Thread | None = None
        self._start(0)

    @property
    def events(self) -> list[Event]:
        return self._output.taken.events

    @property
    def replays(self) -> int:
        return self._output.taken.replays

    def _start(self, commit: int) -> None:
        self._at = next(
            (i for i, e in enumerate(self.source.log) if e.commit > commit), len(self.source.log)
        )
        self._handed = 0
        self._reader = ScriptedLog(self._output, self.source)
        self._stats = TailerStats()
        self._session = Session(
            source_name=SOURCE_NAME,
            db=DB,
            reader=self._reader,
            store=self._store,
            output=self._output,
            leadership=self._leadership,
            settings=SETTINGS,
            stats=self._stats,
            reconciler=self._new_reconciler,
        )
        self._thread = threading.Thread(target=self._serve, args=(self._session,), daemon=True)
        self._thread.start()

    def _new_reconciler(self, source_name: str, db: str) -> Reconciler:
        """The reconciler under test, noting where each window opens and closes (`bounds`)."""
        reconciler = self._reconciler_class(source_name, db)
        low, high = reconciler.low_watermark, reconciler.high_watermark
        lws: dict[str, int] = {}

        def low_watermark(window: Window, position: Position) -> Opened | Failed:
            lws[window.window_id] = position.commit
            return low(window, position)

        def high_watermark(window: Window, position: Position) -> Closed | Failed:
            closed = high(window, position)
            if isinstance(closed, Closed) and window.window_id in lws:
                self.bounds[window.window_id] = (lws[window.window_id], position.commit)
            return closed

        reconciler.low_watermark = low_watermark  # type: ignore[method-assign]
        reconciler.high_watermark = high_watermark  # type: ignore[method-assign]
        self._reconciler = reconciler
        return reconciler

    def _serve(self, session: Session) -> None:
        try:
            session.run(threading.Event())
        except _Aborted:
            pass
        except BaseException as exc:
            self._reader.done.put(exc)
            return
        self._reader.done.put(None)

    def _do(self, command: _Command) -> None:
        self._reader.commands.put(command)
        try:
            failure = self._reader.done.get(timeout=COMMAND_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"the session did not answer {command} in time") from None
        if failure is not None:
            raise failure
        if not isinstance(command, _End):  # the session waits for its next item: look at it
            open_now = len(list(self._reconciler.open_windows()))
            assert self._stats.open_windows == open_now, "dblog_tailer_windows_open is stale"
        if self._reader.acknowledged > self._acks[-1]:
            self._acks.append(self._reader.acknowledged)

    def tail(self, entries: int, idle_first: bool = False) -> None:
        items: list[LogItem] = []
        if idle_first and self._at:
            items.append(Idle(self.source.log[self._at - 1].commit + 9))
        entries_read = self.source.log[self._at : self._at + entries]
        for entry in entries_read:
            items.extend(log_items(entry))
            self._handed = entry.commit
        self._at += len(entries_read)
        self._do(_Feed(items, self._handed, self._log_end()))

    def _log_end(self) -> int:
        """Where the `Idle`s of a feed say the log ends: its end once every entry is read."""
        return self.source.log_end if self._at >= len(self.source.log) else self._handed

    def hold(self) -> None:
        self._output.set_mode("hold")

    def release(self) -> None:
        self._output.set_mode("pass")
        self._do(_Feed([], self._handed, self._log_end()))

    def restart(self, acks_lost: int) -> None:
        self._end()
        self._start(self._acks[max(0, len(self._acks) - 1 - acks_lost)])

    def expire(self) -> None:
        overdue = time.monotonic() + SETTINGS.window_ttl_s + 1
        self._do(_Call(lambda: self._session.housekeeping(overdue)))

    def finish(self) -> None:
        self.release()
        self.tail(len(self.source.log))
        self._end()

    def _end(self) -> None:
        """End the session: at once if its writer is stuck in the held output (what it holds
        is lost), else cleanly (everything handed over is durable already)."""
        abort = self._output.held and self._output.blocked
        self.lost_batches += abort
        self._output.set_mode("abort" if abort else "pass")
        self._do(_End(abort))
        assert self._thread is not None
        self._thread.join(COMMAND_TIMEOUT_S)
        assert not self._thread.is_alive(), "the session did not end"
        self._output.set_mode("pass")

    def close(self) -> None:
        """After a failed history: stop the session thread if it still runs."""
        if self._thread is not None and self._thread.is_alive():
            self._output.set_mode("abort")
            self._reader.commands.put(_End(abort=True))
            self._thread.join(COMMAND_TIMEOUT_S)


@pytest.fixture(scope="module")
def client(redis_server: RedisInfo) -> Iterator[redis.Redis]:
    with dataclasses.replace(redis_server, db=REDIS_DB).client() as client:
        yield client
        client.flushdb()


def run_production(
    history: History, client: redis.Redis, reconciler_class: type[Reconciler] = Reconciler
) -> None:
    client.flushdb()
    store = StateStore(client, SOURCE_NAME)
    drivers: list[SessionDriver] = []

    def start_tailer(source: Source) -> SessionDriver:
        drivers.append(SessionDriver(source, store, reconciler_class))
        return drivers[-1]

    try:
        with mock.patch.object(session_module, "_POSITIONAL_POLL_S", 0.0):
            run_history(history, RedisWindows(store), start_tailer)
    finally:
        for driver in drivers:
            driver.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(history=histories)
def test_production_tailer_converges(client: redis.Redis, history: History) -> None:
    run_production(history, client)


@pytest.mark.parametrize("broken", BROKEN_RECONCILERS, ids=lambda c: c.__name__)
def test_broken_reconcilers_are_caught_in_production(
    client: redis.Redis, broken: type[Reconciler]
) -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(histories)
    def broken_run(history: History) -> None:
        run_production(history, client, broken)

    with pytest.raises(AssertionError):
        broken_run()
