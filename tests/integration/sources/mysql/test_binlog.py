"""The MySQL/MariaDB log reader on a real MariaDB, through the real `Tailer` into NDJSON: changes
in commit order with growing positions, a big transaction, a tailer SIGKILLed and restarted, the
server restarted under a running tailer, and a binlog purged past the resume point."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pymysql
import pytest

from airflow_provider_dblog.core.event import Event, Op, Row, TableRef
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    single_changes,
)
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.sources.mysql.binlog import BinlogPurged, MysqlLogReader
from airflow_provider_dblog.sources.mysql.catalog import table_shape
from airflow_provider_dblog.sources.mysql.config import SESSION_INIT
from airflow_provider_dblog.sources.mysql.resume import ResumePoint
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import TailProcess, backwards, run_cli, wait_until
from tests.integration.mysql_log_support import (
    InThreadTailer,
    MysqlCapture,
    cli_env,
    events_in,
    iter_transactions,
    rebuild,
    write_toml,
)
from tests.integration.sources.mysql.test_types import COLUMNS, ROWS, dumped

pytestmark = pytest.mark.integration

BIG = 50_000
SEEDED_FROM = 1_000_000


@pytest.fixture
def capture(mariadb: MariaDBInfo) -> Iterator[MysqlCapture]:
    databases = MysqlCapture(mariadb)
    yield databases
    databases.drop()


def count_events(directory: Path) -> int:
    """Events written so far, counted by their lines (cheaper than decoding them)."""
    if not directory.exists():
        return 0
    return sum(p.read_bytes().count(b"\n") for p in directory.glob("*.ndjson"))


def strictly_increasing(events: list[Event]) -> bool:
    return all(a.position < b.position for a, b in pairwise(events))


def test_changes_reach_ndjson_in_commit_order_a_big_transaction_included(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    directory = tmp_path / "events"
    tailer = InThreadTailer(capture, redis_server, directory)
    try:
        capture.execute("INSERT INTO items VALUES (1, 'one', 1.50), (4294967295, 'max', NULL)")
        capture.execute(
            "UPDATE items SET note = 'uno' WHERE id = 1",
            "DELETE FROM items WHERE id = 4294967295",
            "INSERT INTO items VALUES (2, 'two', 2)",
        )
        capture.execute("UPDATE items SET id = 3 WHERE id = 2")
        capture.execute(
            f"INSERT INTO items SELECT seq, CONCAT('n', seq), seq / 100 FROM seq_10_to_{BIG + 9}"
        )
        capture.execute("UPDATE items SET amount = amount + 1 WHERE id >= 10")
        expected = 2 + 3 + 2 + BIG + BIG
        wait_until(lambda: count_events(directory) >= expected, 120, f"{expected} events")
    finally:
        tailer.stop()
    events = events_in(directory)
    assert len(events) == expected
    assert strictly_increasing(events), "positions grow in output order"
    assert rebuild(events) == capture.rows()
    head = [(e.op, e.key["id"], e.position.seq) for e in events[:7]]
    assert head == [
        (Op.CREATE, 1, 0),
        (Op.CREATE, 4294967295, 1),
        (Op.UPDATE, 1, 0),
        (Op.DELETE, 4294967295, 1),
        (Op.CREATE, 2, 2),
        (Op.DELETE, 2, 0),
        (Op.CREATE, 3, 1),
    ]
    assert events[1].after == {"id": 4294967295, "note": "max", "amount": None}
    transactions = list(iter_transactions(events))
    assert [len(t) for t in transactions] == [2, 3, 2, BIG, BIG]
    assert [e.position.seq for e in transactions[3]] == list(range(BIG))
    assert {e.op for e in transactions[4]} == {Op.UPDATE}
    checkpoint = tailer.store.tailer.load_checkpoint()
    assert checkpoint is not None and checkpoint >= events[-1].position.commit


def test_alter_and_truncate_of_a_captured_table_become_table_events(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """An ALTER between changes is a schema event at its own position with the new columns and
    a new version, and the rows after it carry them; a TRUNCATE is a `t` event."""
    directory = tmp_path / "events"
    tailer = InThreadTailer(capture, redis_server, directory)
    try:
        capture.execute("INSERT INTO items VALUES (1, 'one', 1)")
        capture.execute("ALTER TABLE items ADD COLUMN tag varchar(8) DEFAULT 'x'")
        capture.execute("INSERT INTO items (id, note, amount) VALUES (2, 'two', 2)")
        capture.execute("TRUNCATE TABLE items")
        capture.execute("INSERT INTO items VALUES (3, 'three', 3, 'y')")
        wait_until(lambda: count_events(directory) >= 5, 30, "5 events")
    finally:
        tailer.stop()
    events = events_in(directory)
    assert [(e.op, e.schema_version) for e in events] == [
        (Op.CREATE, 0),
        (Op.SCHEMA, 1),
        (Op.CREATE, 1),
        (Op.TRUNCATE, 1),
        (Op.CREATE, 1),
    ]
    assert strictly_increasing(events)
    altered = events[1].table_schema
    assert altered is not None
    assert [c.to_json() for c in altered.columns][-1] == {
        "name": "tag",
        "type": "varchar(8)",
        "nullable": True,
        "default": "'x'",
    }
    assert altered.key == ("id",)
    assert events[2].after == {"id": 2, "note": "two", "amount": "2.00", "tag": "x"}
    assert rebuild(events) == {3: ("three", "3.00")}


def test_a_new_tailer_saves_where_capture_starts_before_any_change(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """The first tailer of a source saves the log's end as its resume point before it reads
    anything, so changes made while it is down, before it ever saw one, are not lost."""
    directory = tmp_path / "events"
    tailer = InThreadTailer(capture, redis_server, directory)
    saved = tailer.store.tailer.load_resume()
    tailer.stop()
    assert saved is not None, "saved by the time the tailer first beat"
    with capture.admin() as cursor:
        cursor.execute("SHOW MASTER STATUS")
        status = cursor.fetchone()
    assert status is not None
    assert (ResumePoint.from_text(saved).file, ResumePoint.from_text(saved).offset) == (
        status[0],
        status[1],
    )
    capture.execute("INSERT INTO items VALUES (1, 'while down', 1)")
    tailer = InThreadTailer(capture, redis_server, directory)
    try:
        wait_until(lambda: count_events(directory) >= 1, 30, "the change made while down")
    finally:
        tailer.stop()
    assert [(e.op, e.key) for e in events_in(directory)] == [(Op.CREATE, {"id": 1})]


def test_the_reader_gives_the_dump_json_for_every_type(capture: MysqlCapture) -> None:
    """Every supported type written and updated, read by the log reader (the catalog's
    converters matched by binlog names, the empty SET told from NULL) and by a query as the
    dump reads: the same JSON, byte for byte."""
    table = TableRef(capture.database, "types")
    with capture.admin() as cursor:
        cursor.execute(f"CREATE TABLE `{table.schema}`.`{table.name}` ({COLUMNS})")
    reader = MysqlLogReader(replace(capture.config, tables=(table,)), None, heartbeat_s=0.2)
    try:
        items = single_changes(reader.items())
        next(items)  # where capture starts
        with capture.admin() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")
            for values in ROWS:
                cursor.execute(f"INSERT INTO `{table.schema}`.`{table.name}` VALUES {values}")
            cursor.execute(
                f"UPDATE `{table.schema}`.`{table.name}` SET s = '', bn = x'00ff' WHERE id = 3"
            )
        logged: dict[object, Row] = {}
        for item in items:
            if isinstance(item, Change) and item.event.after is not None:
                logged[item.event.key["id"]] = item.event.after
            if len(logged) == len(ROWS) and isinstance(item, Idle):
                break
        described = reader.describe(table)
    finally:
        reader.close()
    with pymysql.connect(**capture.info.connect_kwargs(), init_command=SESSION_INIT) as conn:
        from_dump = dumped(conn, table_shape(conn, table))
    assert described.names == tuple(from_dump[0]) and described.key == ("id",)
    from_log = [logged[k] for k in sorted(logged)]
    assert [json.dumps(r, ensure_ascii=False) for r in from_log] == [
        json.dumps(r, ensure_ascii=False) for r in from_dump
    ]
    assert from_log[0]["iu"] == 4294967295 and from_log[2]["s"] == ""


def test_a_big_transaction_is_read_in_bounded_memory(capture: MysqlCapture) -> None:
    """Changes are handed over as their rows events are read, never a transaction at a time:
    reading a transaction of 400k rows grows the process by well under 100 MiB (holding its
    400k changes takes about 280 MiB; bench P4 reads a million rows through the tailer)."""
    rows = 400_000
    reader = MysqlLogReader(capture.config, None, heartbeat_s=0.5)
    try:
        items = single_changes(reader.items())
        next(items)  # where capture starts
        capture.execute(
            f"INSERT INTO items SELECT seq, 'a note of some length', seq FROM seq_1_to_{rows}"
        )
        baseline = rss_bytes()
        peak = baseline
        seen = 0
        for item in items:
            if isinstance(item, Change):
                seen += 1
                if seen % 50_000 == 0:
                    peak = max(peak, rss_bytes())
            elif isinstance(item, TransactionEnd):
                break
    finally:
        reader.close()
    assert seen == rows
    assert peak - baseline < 100 * 2**20, f"grew by {(peak - baseline) / 2**20:.0f} MiB"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_reader_behind_a_dropped_column_reads_on(capture: MysqlCapture) -> None:
    """Rows logged with a column that a later ALTER dropped, read after the ALTER (a tailer
    restarted after downtime): the catalog no longer has the column, and reading goes on with
    its value as plain JSON, then the ALTER describes the table without it."""
    with capture.admin() as cursor:
        cursor.execute(f"ALTER TABLE `{capture.database}`.items ADD COLUMN tag varchar(8)")
    first = MysqlLogReader(capture.config, None, heartbeat_s=0.2)
    try:
        start = next(first.items())
        assert isinstance(start, Idle)
        saved = first.acknowledge(start.log_end)
    finally:
        first.close()
    capture.execute("INSERT INTO items VALUES (1, 'one', 1, 'kept')")
    with capture.admin() as cursor:
        cursor.execute(f"ALTER TABLE `{capture.database}`.items DROP COLUMN tag")
    again = MysqlLogReader(capture.config, saved, heartbeat_s=0.2)
    try:
        read: list[LogItem] = []
        for item in single_changes(again.items()):
            read.append(item)
            if isinstance(item, SchemaDescription):
                break
    finally:
        again.close()
    changes = [i.event for i in read if isinstance(i, Change)]
    assert [e.after for e in changes] == [{"id": 1, "note": "one", "amount": "1.00", "tag": "kept"}]
    described = read[-1]
    assert isinstance(described, SchemaDescription)
    assert described.schema.names == ("id", "note", "amount")


def test_an_xa_transaction_ends_at_its_prepare(capture: MysqlCapture) -> None:
    """MariaDB logs an XA transaction's rows as a group ending at XA PREPARE, and XA COMMIT as
    a group of its own: each ends with a `TransactionEnd`, and reading goes on."""
    reader = MysqlLogReader(capture.config, None, heartbeat_s=0.2)
    try:
        items = single_changes(reader.items())
        next(items)  # where capture starts
        with capture.admin() as cursor:
            cursor.execute(f"USE `{capture.database}`")
            for statement in (
                "XA START 'dblog-xa'",
                "INSERT INTO items VALUES (1, 'xa', 1)",
                "XA END 'dblog-xa'",
                "XA PREPARE 'dblog-xa'",
                "XA COMMIT 'dblog-xa'",
                "INSERT INTO items VALUES (2, 'after', 2)",
            ):
                cursor.execute(statement)
        seen: list[object] = []
        for item in items:
            if isinstance(item, Change):
                seen.append(item.event.key["id"])
            elif isinstance(item, TransactionEnd):
                seen.append("end")
                if 2 in seen:
                    break
    finally:
        reader.close()
    assert seen == [1, "end", "end", 2, "end"]


def test_the_backlog_is_the_binlog_after_the_acknowledged_point(capture: MysqlCapture) -> None:
    reader = MysqlLogReader(capture.config, None, heartbeat_s=0.2)
    try:
        items = single_changes(reader.items())
        start = next(items)
        assert isinstance(start, Idle)
        reader.acknowledge(start.log_end)
        assert reader.log_backlog().behind_bytes == 0
        capture.execute("INSERT INTO items VALUES (1, 'behind', 1)")
        end = next(item for item in items if isinstance(item, TransactionEnd))
        behind = reader.log_backlog()
        assert behind.behind_bytes > 0 and behind.retained_bytes is None
        reader.acknowledge(end.commit)
        assert reader.log_backlog().behind_bytes == 0
    finally:
        reader.close()


class Workload:
    """Transactions written one after another in a thread until stopped: each inserts a row,
    updates the one before and deletes the one three before; with `seeded` rows (ids from
    `SEEDED_FROM`), it updates one of those too."""

    def __init__(self, capture: MysqlCapture, seeded: int = 0) -> None:
        self._capture = capture
        self._seeded = seeded
        self._stop = threading.Event()
        self.written = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            i = 0
            while not self._stop.is_set():
                i += 1
                statements = [
                    f"INSERT INTO items VALUES ({i}, 'n{i}', {i})",
                    f"UPDATE items SET note = 'u{i}' WHERE id = {i - 1}",
                    f"DELETE FROM items WHERE id = {i - 3}",
                ]
                if self._seeded:
                    seeded = SEEDED_FROM + i * 7 % self._seeded
                    statements.append(f"UPDATE items SET amount = {i} WHERE id = {seeded}")
                self._capture.execute(*statements)
                self.written = i
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error


def test_a_killed_tailer_restarted_loses_nothing_and_rereads_only_the_unacknowledged(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """SIGKILL the tailer process under a write workload and start another: the output holds
    every change once (NDJSON drops the replayed ones), and the second tailer read exactly the
    changes after the first's checkpoint, not the log from its start nor from its end."""
    directory = tmp_path / "events"
    config = write_toml(capture, redis_server, directory, tmp_path / "dblog.toml")
    env = cli_env(capture, redis_server)
    store = StateStore(redis_server.client(), capture.config.name)
    first = TailProcess(config, "first", env, tmp_path / "first.log")
    second: TailProcess | None = None
    workload: Workload | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the first tailer leading")
        workload = Workload(capture)
        wait_until(lambda: count_events(directory) >= 300, 60, "300 events written")
        first.kill()
        checkpoint = store.tailer.load_checkpoint()
        assert checkpoint is not None
        written_by_first = count_events(directory)
        second = TailProcess(config, "second", env, tmp_path / "second.log")
        wait_until(
            lambda: count_events(directory) >= written_by_first + 300,
            60,
            "the second tailer writing",
        )
        workload.stop()
        wait_until(lambda: rebuild(events_in(directory)) == capture.rows(), 60, "caught up")
        events = events_in(directory)
        after_checkpoint = sum(1 for e in events if e.position.commit > checkpoint)
        wait_until(
            lambda: events_read(store) == after_checkpoint,
            30,
            f"the second tailer having read the {after_checkpoint} events after the checkpoint",
        )
    finally:
        if workload is not None:
            workload.stop()
        for tail in (first, second):
            if tail is not None and tail.alive():
                tail.stop()
    assert strictly_increasing(events)
    assert 0 < after_checkpoint < len(events)


def events_read(store: StateStore) -> object:
    health = store.tailer.health()
    return None if health is None else health.metrics.get("events")


def test_the_tailer_rides_through_a_server_restart_and_loses_nothing(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    directory = tmp_path / "events"
    tailer = InThreadTailer(capture, redis_server, directory)
    try:
        capture.execute("INSERT INTO items VALUES (1, 'before', 1)")
        wait_until(lambda: count_events(directory) >= 1, 30, "the first change")
        first = events_in(directory)[0].position.commit
        wait_until(
            lambda: (tailer.store.tailer.load_checkpoint() or 0) >= first, 30, "a checkpoint"
        )
        capture.info.restart()
        capture.execute("INSERT INTO items VALUES (2, 'after', 2)")
        capture.execute("UPDATE items SET note = 'after too' WHERE id = 1")
        wait_until(lambda: rebuild(events_in(directory)) == capture.rows(), 60, "caught up")
        wait_until(lambda: state_of(tailer.store) == "leading", 30, "leading again")
    finally:
        tailer.stop()
    events = events_in(directory)
    assert [(e.op, e.key["id"]) for e in events] == [
        (Op.CREATE, 1),
        (Op.CREATE, 2),
        (Op.UPDATE, 1),
    ]
    assert strictly_increasing(events)
    assert events[1].position.commit >> 32 > events[0].position.commit >> 32, "a new binlog"


def state_of(store: StateStore) -> object:
    health = store.tailer.health()
    return None if health is None else health.metrics.get("state")


def test_a_binlog_purged_past_the_resume_point_is_an_error_naming_it(
    capture: MysqlCapture,
) -> None:
    reader = MysqlLogReader(capture.config, None, heartbeat_s=0.2)
    try:
        items = single_changes(reader.items())
        idle = next(item for item in items if isinstance(item, Idle))
        saved = reader.acknowledge(idle.log_end)
    finally:
        reader.close()
    assert saved is not None
    point = ResumePoint.from_text(saved)
    capture.execute("INSERT INTO items VALUES (1, 'lost', 1)")
    with capture.admin() as cursor:
        cursor.execute("FLUSH BINARY LOGS")
        cursor.execute("SHOW MASTER STATUS")
        current = cursor.fetchone()
        assert current is not None

        def purged() -> bool:
            """MariaDB keeps a binlog until its transactions are checkpointed: try again."""
            cursor.execute(f"PURGE BINARY LOGS TO '{current[0]}'")
            cursor.execute("SHOW BINARY LOGS")
            return point.file not in {row[0] for row in cursor.fetchall()}

        wait_until(purged, 30, f"{point.file} purged")
    again = MysqlLogReader(capture.config, saved, heartbeat_s=0.2)
    try:
        with pytest.raises(BinlogPurged) as raised:
            next(again.items())
    finally:
        again.close()
    message = str(raised.value)
    assert point.file in message and "tailer:resume" in message and "dump" in message


def test_a_cli_dump_under_writes_converges_with_the_log(
    capture: MysqlCapture, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """`dblog tail` and `dblog dump` (chunks of 50, two windows in flight) on MariaDB while
    transactions insert, update and delete, some on the rows the dump reads: the NDJSON stream
    alone rebuilds the table, and no key goes back to an older position in it."""
    seeded = 600
    capture.execute(
        f"INSERT INTO items SELECT seq, CONCAT('s', seq), seq MOD 1000 "
        f"FROM seq_{SEEDED_FROM}_to_{SEEDED_FROM + seeded - 1}"
    )
    directory = tmp_path / "events"
    config = write_toml(capture, redis_server, directory, tmp_path / "dblog.toml")
    env = cli_env(capture, redis_server)
    store = StateStore(redis_server.client(), capture.config.name)
    tail = TailProcess(config, "mysql-cli", env, tmp_path / "tail.log")
    workload: Workload | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "dblog tail leading")
        workload = Workload(capture, seeded)
        wait_until(lambda: workload is not None and workload.written >= 20, 30, "writes")
        done = run_cli(
            "dump",
            "-c",
            str(config),
            "--dump-id",
            "mysql-full",
            "--chunk-size",
            "50",
            "--parallelism",
            "2",
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        workload.stop()
        wait_until(lambda: rebuild(events_in(directory)) == capture.rows(), 60, "converged")
    finally:
        if workload is not None:
            workload.stop()
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    events = events_in(directory)
    dumped = [e for e in events if e.op is Op.READ]
    assert len(dumped) >= 500, "the dump read the seeded rows (less the ones changed meanwhile)"
    assert not backwards(events)
    status = store.dumps.status("mysql-full")
    assert status is not None and status.state == "done"
