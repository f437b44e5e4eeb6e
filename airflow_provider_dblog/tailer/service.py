"""The tailer as a service: wait for the lease, lead sessions while holding it, stand by again
after losing it.

A session that ends because the source, Redis or the output went away is started again with
backoff, from the last durable position, by the same leader: the log says so once when the
outage starts and once when a session is under way again (`Outage`). A lost lease (a store write
or an output write refused by the fencing token) makes it a standby. Any other error ends `run`
with `TailerFailed`, naming the cause, so that a supervisor restarts the process: logged as one
line if it is one of this project's (a source refusing, a bad output), with its traceback if it
is a bug.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.leased_service import lead_while_leased, metrics_served
from airflow_provider_dblog.outage import Outage
from airflow_provider_dblog.outputs.base import Output, OutputFenced, OutputUnavailable
from airflow_provider_dblog.settings import TailerSettings
from airflow_provider_dblog.sources.base import (
    LogBacklog,
    LogReader,
    ReportsLogBacklog,
    Source,
    SourceUnavailable,
)
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import FencedOut, StateStore, StateStoreUnavailable
from airflow_provider_dblog.tailer.metrics import TailerMetrics, TailerStats
from airflow_provider_dblog.tailer.session import Leadership, Session, WriterStuck
from airflow_provider_dblog.targets import open_output
from airflow_provider_dblog.verify.metrics import VerifyCollector

if TYPE_CHECKING:  # config.py reads TailerSettings from this package
    from airflow_provider_dblog.config import Config

log = logging.getLogger(__name__)

_UNAVAILABLE = (SourceUnavailable, StateStoreUnavailable, OutputUnavailable)
FIRST_RETRY_S = 0.5
"""The first backoff after an outage begins; each next one doubles, up to `reconnect_max_s`."""


class TailerFailed(DBLogError):
    """The tailer stopped on an error it cannot ride through; the cause is chained."""


class Tailer:
    """Runs the tailer of `source` until `stop` is set.

    The log is read from the last acknowledged position, kept by the source (PostgreSQL: the
    slot's confirmed flush position) or saved with the checkpoint (MySQL: binlog coordinates and
    GTIDs), so a new session re-reads what was not acknowledged. `output` is an open output,
    or a function that opens one: then it is opened only once this tailer holds the lease, and
    closed when it stops leading. With `settings.metrics_port` set, `run` serves `metrics`
    over HTTP meanwhile.
    """

    def __init__(
        self,
        source: Source,
        store: StateStore,
        output: Output | Callable[[], Output],
        *,
        owner: str | None = None,
        settings: TailerSettings | None = None,
    ) -> None:
        self._source = source
        self._store = store
        self._open_output = output
        self._output: Output | None = output if isinstance(output, Output) else None
        self._owner = owner or f"{socket.gethostname()}:{threading.get_native_id()}"
        self._settings = settings or TailerSettings()
        self.stats = TailerStats()
        self._reader: LogReader | None = None
        """The current session's reader, which the metrics ask for the log backlog."""
        self._reload = threading.Event()
        self._next_source: Source | None = None
        self.metrics = TailerMetrics(self.stats, self._log_backlog, VerifyCollector(store))
        self.acknowledged: int | None = None
        """The checkpoint when this tailer stopped leading on `stop`: the last position it
        acknowledged (None if it did not lead then), for the line `dblog tail` ends with."""

    @property
    def owner(self) -> str:
        return self._owner

    @classmethod
    def from_config(cls, config: Config, *, owner: str | None = None) -> Tailer:
        """The tailer a deployment's TOML describes; its output is opened once it leads."""
        source = source_for(config.source)
        settings = config.tailer
        return cls(
            source,
            StateStore(config.redis_client(), source.name),
            lambda: open_output(config.output, max_wait_s=settings.lease_ttl_ms / 4000),
            owner=owner,
            settings=settings,
        )

    def start(self, stop: threading.Event, ready_timeout_s: float = 30.0) -> threading.Thread:
        """`run(stop)` in a daemon thread, returned once a tailer of this source has beaten
        (it holds the lease and reads): for the demo and tests, which need it up first."""
        thread = threading.Thread(target=self.run, args=(stop,), name="dblog-tailer", daemon=True)
        thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while self._store.tailer.health() is None:
            if not thread.is_alive():
                raise RuntimeError(f"the tailer of {self._source.name} stopped before it beat")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tailer of {self._source.name} did not beat in time")
            time.sleep(0.05)
        return thread

    def reload(self, source: Source) -> None:
        """Follow `source` from now on (the same source, with other captured tables: a reload
        of the TOML). The current session ends at its next transaction boundary, everything
        handed over made durable, and the next one reads from the acknowledged position with
        `source`'s reader, without giving up the lease: a table added is followed from there,
        one removed is no longer. The change is recorded for `dblog status`. `source` must be
        set up (`ensure_setup`) already."""
        self._next_source = source
        self._reload.set()

    def set_up(self, stop: threading.Event) -> bool:
        """Set the source up (`Source.ensure_setup`), waiting out an outage with the sessions'
        backoff: a tailer may start before its server, or while it restarts. False if `stop`
        came first. Any other error is the server's answer (no logical `wal_level`, a missing
        table or grant) and is raised at once."""
        outage = Outage(log)
        delay = FIRST_RETRY_S
        while True:
            try:
                self._source.ensure_setup()
            except SourceUnavailable as exc:
                outage.away("source", exc)
                if stop.wait(delay):
                    return False
                delay = min(delay * 2, self._settings.reconnect_max_s)
            else:
                outage.back()
                return True

    def run(self, stop: threading.Event) -> None:
        """Lead while holding the lease; after losing it, wait again as a standby. An error it
        cannot ride through ends it with `TailerFailed`, logged here as its last line."""
        settings = self._settings
        try:
            with metrics_served(
                self.metrics, settings.metrics_port, settings.metrics_address, TailerFailed
            ):
                lead_while_leased(
                    self._store.tailer.lease,
                    self._owner,
                    settings.lease_ttl_ms,
                    stop,
                    lambda token: self._lead_until_fenced(stop, token),
                    self._stand_by,
                    log,
                )
        except TailerFailed as failed:
            if isinstance(failed.__cause__, (DBLogError, WriterStuck, OSError)):
                log.error("%s", failed)  # the message says it all
            else:
                log.exception("%s", failed)
            raise

    def _stand_by(self) -> None:
        self.stats.state = "standby"
        log.info("tailer %s is a standby: another tailer holds the lease", self._owner)

    def _lead_until_fenced(self, stop: threading.Event, token: int) -> None:
        """Lead until `stop`, or until a write is refused by the fencing token (then stand by
        again); any other error ends the tailer."""
        try:
            self._lead(stop, Leadership(self._owner, token))
        except (FencedOut, OutputFenced) as exc:
            log.warning("%s; waiting for the lease again as a standby", exc)
        except Exception as exc:
            said = " ".join(str(exc).split())
            raise TailerFailed(
                f"tailer {self._owner} stopped: {type(exc).__name__}: {said}"
            ) from exc

    def _check_redis(self) -> None:
        """Refuse a Redis that evicts keys (`EvictingRedis` ends the tailer): it would lose
        windows and the checkpoint silently. One that cannot be reached now is met by the
        session, which waits it out."""
        with contextlib.suppress(StateStoreUnavailable):
            self._store.check_server()

    def _lead(self, stop: threading.Event, leadership: Leadership) -> None:
        log.info("tailer %s holds the lease (token %d)", leadership.owner, leadership.token)
        self.stats.lease_token = leadership.token
        outage = Outage(log)
        delay = FIRST_RETRY_S
        opened_here = self._output is None
        above_fence = False
        try:
            self._check_redis()
            while not stop.is_set():
                started = time.monotonic()
                try:
                    if not above_fence:
                        leadership = self._above_output_fence(leadership)
                        above_fence = True
                    session = self._session(leadership)
                    outage.back()  # the source, Redis and the output answered
                    with self._woken_by_dumps(session):
                        session.run(_StopOrReload(stop, self._reload))
                    if not self._reload.is_set():
                        return
                    continue  # the next session takes the reload
                except _UNAVAILABLE as exc:
                    what = _what_is_unavailable(exc)
                    if time.monotonic() - started > self._settings.reconnect_max_s:
                        delay = FIRST_RETRY_S  # it ran a while: a new outage, not the same one
                    self.stats.state = f"{what} unavailable: {exc}"
                    outage.away(what, exc)
                    self._renew(leadership)
                    self._beat(leadership)
                if self._pause(stop, delay, leadership):
                    return
                delay = min(delay * 2, self._settings.reconnect_max_s)
        finally:
            if stop.is_set():
                with contextlib.suppress(StateStoreUnavailable):
                    self.acknowledged = self._store.tailer.load_checkpoint()
            self._reader = None
            self.stats.lease_token = 0
            if opened_here and self._output is not None:
                with contextlib.suppress(Exception):
                    self._output.close()
                self._output = None
            with contextlib.suppress(StateStoreUnavailable):
                self._store.tailer.release_lease(leadership.owner, leadership.token)

    def _above_output_fence(self, leadership: Leadership) -> Leadership:
        """The output opened, and this leader's token raised above the largest one the output
        took if it is not already: a Redis that failed over to a replica which missed the last
        tokens (or came back from an older AOF, or runs a clock behind) may hand out a token
        an earlier leader wrote with, and both would pass the output's fence."""
        output = self._output_opened()
        fence = output.fence(self._source.name)
        if fence is None or fence < leadership.token:
            return leadership
        token = self._store.tailer.raise_lease_above(leadership.owner, leadership.token, fence)
        if token is None:
            raise FencedOut(f"tailer {leadership.owner} lost its lease (token {leadership.token})")
        log.warning(
            "the output already took lease token %d, this leader's was %d: leading with %d "
            "(the Redis state store handed out an old token: a failover or a restore?)",
            fence,
            leadership.token,
            token,
        )
        self.stats.lease_token = token
        return Leadership(leadership.owner, token)

    def _output_opened(self) -> Output:
        if self._output is None:
            assert not isinstance(self._open_output, Output)
            self._output = self._open_output()
        return self._output

    def _session(self, leadership: Leadership) -> Session:
        """A new session: the output opened if this leader has none yet, the source's
        database named, a fresh reader from the last saved checkpoint's resume point."""
        output = self._output_opened()
        if self._reload.is_set():
            self._take_reload(leadership)
        db = self._source.database()
        self.stats.state = "leading"
        self._reader = self._source.log_reader(self._store.tailer.load_resume())
        return Session(
            source_name=self._source.name,
            db=db,
            reader=self._reader,
            store=self._store,
            output=output,
            leadership=leadership,
            settings=self._settings,
            stats=self.stats,
        )

    @contextlib.contextmanager
    def _woken_by_dumps(self, session: Session) -> Iterator[None]:
        """While `session` runs, a thread wakes it each time a dump adds or readies a read-only
        window, so that a read-only chunk does not wait for the session's next poll."""
        stop = threading.Event()

        def follow() -> None:
            for _ in self._store.positional.wakes(stop):
                session.wake()

        thread = threading.Thread(target=follow, name="dblog-tailer-wakes", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()

    def _take_reload(self, leadership: Leadership) -> None:
        source, self._next_source = self._next_source, None
        self._reload.clear()
        if source is None:
            return
        before, after = set(self._source.tables), set(source.tables)
        added, removed = sorted(after - before, key=str), sorted(before - after, key=str)
        self._source = source
        log.info(
            "tailer %s follows the reloaded tables: added %s, removed %s",
            leadership.owner,
            ", ".join(map(str, added)) or "none",
            ", ".join(map(str, removed)) or "none",
        )
        try:
            self._store.tailer.record_tables(leadership.owner, added, removed)
        except StateStoreUnavailable as exc:
            log.warning("could not record the reloaded tables for dblog status: %s", exc)

    # -- lease --------------------------------------------------------------------------------

    def _renew(self, leadership: Leadership) -> None:
        """Before reconnecting: still the leader? (Redis may still be down: try again later.)"""
        with contextlib.suppress(StateStoreUnavailable):
            ttl = self._settings.lease_ttl_ms
            if not self._store.tailer.renew_lease(leadership.owner, leadership.token, ttl):
                raise FencedOut(
                    f"tailer {leadership.owner} lost its lease (token {leadership.token})"
                )

    def _pause(self, stop: threading.Event, delay: float, leadership: Leadership) -> bool:
        """Back off for `delay` seconds, renewing the lease meanwhile (a backoff longer than the
        lease must not hand it over); True if `stop` was set."""
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if stop.wait(min(left, self._settings.lease_ttl_ms / 4000)):
                return True
            self._renew(leadership)
        return False

    def _beat(self, leadership: Leadership) -> None:
        """Tell `dblog status` why this leader is not reading (Redis may be what is away)."""
        with contextlib.suppress(StateStoreUnavailable):
            self._store.tailer.beat(leadership.owner, self.stats.metrics())

    def _log_backlog(self) -> LogBacklog | None:
        """The current reader's backlog, if it has a reader that can say (metrics thread)."""
        reader = self._reader
        return reader.log_backlog() if isinstance(reader, ReportsLogBacklog) else None


class _StopOrReload:
    """A session ends at its next transaction boundary on either."""

    def __init__(self, stop: threading.Event, reload: threading.Event) -> None:
        self._stop, self._reload = stop, reload

    def is_set(self) -> bool:
        return self._stop.is_set() or self._reload.is_set()


def _what_is_unavailable(exc: BaseException) -> str:
    if isinstance(exc, SourceUnavailable):
        return "source"
    if isinstance(exc, StateStoreUnavailable):
        return "state store"
    return "output"


def tune_gc() -> None:
    """Set the process's garbage collection for a tailer: the young generation collected every
    10,000 container allocations instead of 700, the older ones every 20 collections of the
    one below instead of 10. `dblog tail` calls it (and the benches, which run a tailer in
    their own process).

    Each insert allocates a handful of short-lived objects that hold no cycles (refcounting
    frees them), so the default threshold ran a collection every few dozen events for nothing:
    about a fifth of the tailer thread's CPU per insert. The extra garbage it lets pile up is
    bounded by the thresholds, so memory stays flat (P4).
    """
    gc.set_threshold(10_000, 20, 20)
