"""TLS on every connection to the source, verified, on PostgreSQL and MariaDB servers that let
the `dblog` user in over TLS only (`hostssl`, `REQUIRE SSL`): whatever connects at all is
encrypted, and a clear-text login is shown to be refused.

The end-to-end path runs over TLS that verifies the server's certificate and host name
(`sslmode=verify-full`; `ssl_ca` with `ssl_verify_identity`): the tailer reading the log, a
dump on Spark whose executors read the chunks, while another process writes; the NDJSON
stream rebuilds the source. Chunks also come from a read replica over TLS.
A wrong CA and a certificate for another host are each refused by `dblog tail` and `dblog
dump` in one line that says which, without a traceback; Spark tasks so refused fail the dump
with that line, and the SQL-apply target so refused is an `OutputError`. A MariaDB client
certificate logs in a `REQUIRE X509` user.

The servers' certificate names 127.0.0.1 only, so `localhost` is "another host" for it. One
TLS server per database for the module; their replicas only for the test that reads one.
"""

from __future__ import annotations

import os
import random
import secrets
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest
from pyspark.sql import SparkSession

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica, MariaDBReplicaInfo
from airflow_provider_dblog.devservices.pg_replica import PostgresReplica, PostgresReplicaInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.process import LOOPBACK
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.devservices.tls import TestCA, make_test_ca
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.dump.spark_chunk import SparkChunkReader
from airflow_provider_dblog.dump.spark_run import run_spark_dump
from airflow_provider_dblog.outputs import SqlApplyOutput, read_events
from airflow_provider_dblog.outputs.base import OutputError
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from airflow_provider_dblog.targets import direct_target_for
from tests.installed import installed
from tests.integration.e2e_support import (
    MYSQL_PASSWORD_ENV,
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    SOURCES,
    Databases,
    SourceDatabases,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    make_mysql_databases,
    materialize,
    run_cli,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.spark_support import stop_spark

pytestmark = pytest.mark.integration
ROWS = 300


@pytest.fixture(scope="module")
def ca() -> Iterator[TestCA]:
    """Outside pytest's temp root: the PostgreSQL server (another user) copies from here."""
    with tempfile.TemporaryDirectory(prefix="dblog-test-tls-") as directory:
        yield make_test_ca(Path(directory) / "ca")


@pytest.fixture(scope="module")
def pg_tls(ca: TestCA) -> Iterator[PostgresInfo]:
    tls = ca.server_tls([LOOPBACK])
    with (
        tempfile.TemporaryDirectory(prefix="dblog-test-pg-tls-") as base,
        installed(lambda: PostgresServer(Path(base), tls=tls)) as server,
    ):
        yield server.info


@pytest.fixture(scope="module")
def mariadb_tls(ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBInfo]:
    tls = ca.server_tls([LOOPBACK])
    base = tmp_path_factory.mktemp("mariadb-tls")
    with installed(lambda: MariaDBServer(base, tls=tls)) as server:
        yield server.info


@pytest.fixture(scope="module")
def spark(
    pg_tls: PostgresInfo, mariadb_tls: MariaDBInfo, redis_server: RedisInfo
) -> Iterator[SparkSession]:
    """Executors inherit the environment the JVM started with: passwords must be set first."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ[PASSWORD_ENV] = pg_tls.password
    os.environ[MYSQL_PASSWORD_ENV] = mariadb_tls.password
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dblog-test-tls")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    stop_spark(session)


@pytest.fixture(params=SOURCES)
def tls_source(
    request: pytest.FixtureRequest, pg_tls: PostgresInfo, mariadb_tls: MariaDBInfo
) -> Iterator[SourceDatabases]:
    """A private source (`ROWS` rows per table before capture) on the TLS server."""
    seed_value = random.randrange(1 << 30)
    if request.param == "mariadb":
        dbs: SourceDatabases = make_mysql_databases(mariadb_tls, ROWS, seed_value=seed_value)
    else:
        dbs = make_databases(pg_tls, ROWS, target=False, seed_value=seed_value)
    yield dbs
    drop_databases(dbs)


def verified_tls(dbs: SourceDatabases, ca_file: Path, host: str = LOOPBACK) -> list[str]:
    """The `[source]` lines of a TOML that reaches `dbs` at `host` over TLS verified against
    `ca_file`, its certificate and host name both."""
    if isinstance(dbs, Databases):
        return [
            'type = "postgres"',
            f'dsn = "host={host} port={dbs.pg.port} dbname={dbs.source_db} user={dbs.pg.user} '
            f'sslmode=verify-full sslrootcert={ca_file}"',
            f'slot = "{dbs.slot}"',
        ]
    info = dbs.info
    return [
        'type = "mysql"',
        f'dsn = "mysql://{info.user}@{host}:{info.port}/{dbs.source_db}"',
        f'watermark_database = "{dbs.watermark_db}"',
        f'ssl_ca = "{ca_file}"',
        "ssl_verify_identity = true",
    ]


def assert_refuses_clear_text(server: PostgresInfo | MariaDBInfo) -> None:
    """The server refuses a login of the `dblog` user without TLS."""
    if isinstance(server, PostgresInfo):
        with pytest.raises(psycopg.OperationalError, match="no encryption"):
            psycopg.connect(server.dsn + "?sslmode=disable", connect_timeout=5)
    else:
        with pytest.raises(pymysql.err.OperationalError, match="Access denied"):
            pymysql.connect(**server.connect_kwargs(), ssl_disabled=True)


def test_the_end_to_end_path_runs_over_verified_tls(
    tls_source: SourceDatabases,
    ca: TestCA,
    spark: SparkSession,
    redis_server: RedisInfo,
    tmp_path: Path,
) -> None:
    """The tailer and a dump on Spark (three windows in flight, executors reading the chunks)
    under writes, every connection verifying the server: the dump ends done, the NDJSON
    stream rebuilds the source, and the server refused a clear-text login of the same user."""
    dbs = tls_source
    events_dir = tmp_path / "events"
    config_path = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        source=verified_tls(dbs, ca.ca_file),
    )
    config = load_config(config_path)
    source = source_for(config.source)
    source.ensure_setup()
    store = StateStore(redis_server.client(), source.name)
    output = NdjsonOutput(events_dir)
    tailer = Tailer(
        source, store, output, owner="tls-tailer", settings=TailerSettings(window_ttl_s=60)
    )
    stop = threading.Event()
    thread = tailer.start(stop)
    writer = Writer(dbs, tmp_path, seed_value=23)
    try:
        writer.wait_for(10, timeout_s=60)
        store.dumps.create(
            DumpRequest("tls", DumpKind.ALL, dbs.tables, chunk_size=150, parallelism=3)
        )
        state = run_spark_dump(spark.sparkContext, config, "tls", direct_target_for)
        written = len(writer.stop())
        wait_caught_up(dbs, timeout_s=120, store=store)
        if isinstance(dbs, Databases):
            with psycopg.connect(dbs.pg.admin_dsn) as conn:
                stream = conn.execute(
                    "SELECT s.ssl FROM pg_replication_slots r JOIN pg_stat_ssl s"
                    " ON s.pid = r.active_pid WHERE r.slot_name = %s",
                    (dbs.slot,),
                ).fetchall()
            assert stream == [(True,)], "the replication stream is encrypted"
    finally:
        writer.kill()
        stop.set()
        thread.join(30)
        output.close()
    assert not thread.is_alive(), "the tailer stopped"
    assert state is DumpState.DONE
    assert written > 10, "the writer wrote during the dump"
    status = store.dumps.status("tls")
    assert status is not None and status.rows >= 3 * ROWS
    events = list(read_events(events_dir))
    assert state_differences(source_state(source), materialize(events)) == []
    assert_refuses_clear_text(dbs.pg if isinstance(dbs, Databases) else dbs.info)


@pytest.fixture(scope="module")
def pg_tls_replica(pg_tls: PostgresInfo) -> Iterator[PostgresReplicaInfo]:
    """A hot standby of `pg_tls`: it inherits its certificate, `ssl = on` and `hostssl`."""
    primary = pg_tls.server
    assert isinstance(primary, PostgresServer)
    with (
        tempfile.TemporaryDirectory(prefix="dblog-test-pg-tls-replica-") as base,
        PostgresReplica(primary, Path(base) / "replica") as replica,
    ):
        yield replica.info


@pytest.fixture(scope="module")
def mariadb_tls_replica(
    mariadb_tls: MariaDBInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MariaDBReplicaInfo]:
    """A replica of `mariadb_tls` with its certificate, replicating over verified TLS."""
    primary = mariadb_tls.server
    assert isinstance(primary, MariaDBServer)
    base = tmp_path_factory.mktemp("mariadb-tls-replica")
    with MariaDBReplica(primary, base) as replica:
        yield replica.info


Replica = PostgresReplicaInfo | MariaDBReplicaInfo


@pytest.fixture(params=SOURCES)
def replicated_source(
    request: pytest.FixtureRequest, pg_tls: PostgresInfo, mariadb_tls: MariaDBInfo
) -> Iterator[tuple[SourceDatabases, Replica]]:
    """A private source on a TLS server, and that server's replica. The replica first: a
    MariaDB replica seeded later would miss the source's grants."""
    seed_value = random.randrange(1 << 30)
    replica: Replica
    if request.param == "mariadb":
        replica = request.getfixturevalue("mariadb_tls_replica")
        dbs: SourceDatabases = make_mysql_databases(mariadb_tls, ROWS, seed_value=seed_value)
    else:
        replica = request.getfixturevalue("pg_tls_replica")
        dbs = make_databases(pg_tls, ROWS, target=False, seed_value=seed_value)
    yield dbs, replica
    drop_databases(dbs)


def test_chunks_read_from_a_replica_over_verified_tls(
    replicated_source: tuple[SourceDatabases, Replica],
    ca: TestCA,
    redis_server: RedisInfo,
    tmp_path: Path,
) -> None:
    """`read_replica` over the source's verified TLS: a dump (in this process) reads every
    chunk on the replica, which lets no clear-text login in, and the stream rebuilds the
    source."""
    dbs, replica = replicated_source
    if isinstance(dbs, Databases):
        replica_dsn = (
            f"host={LOOPBACK} port={replica.port} dbname={dbs.source_db} "
            f"user={replica.user} sslmode=verify-full sslrootcert={ca.ca_file}"
        )
    else:
        replica_dsn = f"mysql://{replica.user}@{LOOPBACK}:{replica.port}/{dbs.source_db}"
    events_dir = tmp_path / "events"
    config_path = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        source=[*verified_tls(dbs, ca.ca_file), f'read_replica = "{replica_dsn}"'],
    )
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    config = load_config(config_path)
    source = source_for(config.source)
    source.ensure_setup()
    store = StateStore(redis_server.client(), source.name)
    output = NdjsonOutput(events_dir)
    stop = threading.Event()
    thread = Tailer(source, store, output, owner="tls-tailer").start(stop)
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's heartbeat")
        store.dumps.create(DumpRequest("replica", DumpKind.ALL, dbs.tables, chunk_size=100))
        assert run_dump(store, source.chunk_source, "replica") == "done"
        wait_caught_up(dbs, timeout_s=120, store=store)
    finally:
        stop.set()
        thread.join(30)
        output.close()
    events = list(read_events(events_dir))
    assert state_differences(source_state(source), materialize(events)) == []
    assert_refuses_clear_text(replica)


@pytest.mark.parametrize(
    ("problem", "meaning"),
    [
        ("another CA", "certificate does not verify against the CA"),
        ("another host", "certificate is for another host name"),
    ],
)
def test_a_certificate_that_does_not_verify_stops_tail_and_dump_in_one_line(
    tls_source: SourceDatabases,
    ca: TestCA,
    redis_server: RedisInfo,
    tmp_path: Path,
    problem: str,
    meaning: str,
) -> None:
    """`dblog tail` and `dblog dump` against the TLS server with a CA that did not sign its
    certificate, or at `localhost`, a name the certificate does not hold: exit status 2 (a
    configuration it cannot run with) at once, not a wait for a server that will never
    verify; one line naming the cause, no traceback."""
    if problem == "another CA":
        lines = verified_tls(tls_source, make_test_ca(tmp_path / "other-ca").ca_file)
    else:
        lines = verified_tls(tls_source, ca.ca_file, host="localhost")
    config_path = write_config(
        tmp_path / "dblog.toml",
        tls_source,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        source=lines,
    )
    for command in ("tail", "dump"):
        done = run_cli(command, "--config", str(config_path), env=cli_env(tls_source, redis_server))
        assert done.returncode == 2, done.stderr
        assert meaning in done.stderr and "over TLS" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert tls_source.password not in done.stderr + done.stdout


def test_a_spark_task_refused_by_the_source_fails_the_dump_at_once(
    tls_source: SourceDatabases,
    spark: SparkSession,
    redis_server: RedisInfo,
    tmp_path: Path,
) -> None:
    """Executors whose connection does not verify (here the CA of another authority; on a
    cluster, say, a worker without the CA file) report it rather than fail their job: the
    reader raises the `SourceError` that fails the dump with its message, where a failed job
    would be retried as a window until the attempts are spent. A key chunk runs no query on
    the driver, so only the tasks connect."""
    other_ca = make_test_ca(tmp_path / "other-ca").ca_file
    config_path = write_config(
        tmp_path / "dblog.toml",
        tls_source,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        source=verified_tls(tls_source, other_ca),
    )
    config = load_config(config_path)
    store = StateStore(redis_server.client(), config.source.name)
    reader = SparkChunkReader(spark.sparkContext, config, "none", tasks=2, default_chunk_size=10)
    chunk = Chunk(tls_source.table("accounts"), 0, keys=((1,), (2,), (3,), (4,)))
    source = source_for(config.source).chunk_source()
    try:
        with pytest.raises(SourceError, match=r"a Spark task cannot use the source: .*over TLS"):
            reader(store, source, "no-window", chunk, ("id",))
    finally:
        source.close()


def test_a_sql_target_whose_certificate_does_not_verify_is_an_output_error(
    pg_tls: PostgresInfo, ca: TestCA, tmp_path: Path
) -> None:
    """The SQL-apply output over TLS (libpq's options in its DSN, as the source's): verified,
    it connects; a certificate of another CA is an `OutputError` naming it, which stops the
    tailer, not an `OutputUnavailable` it would wait out."""
    verified = f"{pg_tls.dsn}?sslmode=verify-full&sslrootcert={ca.ca_file}"
    SqlApplyOutput(verified, monotonic=True).close()
    other_ca = make_test_ca(tmp_path / "other-ca").ca_file
    with pytest.raises(OutputError, match="SQL target over TLS: the server's certificate does"):
        SqlApplyOutput(f"{pg_tls.dsn}?sslmode=verify-full&sslrootcert={other_ca}")


def test_a_client_certificate_logs_in_a_mariadb_user_that_requires_one(
    mariadb_tls: MariaDBInfo, ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ssl_cert` and `ssl_key`: a user created `REQUIRE X509` logs in over TLS with a client
    certificate of the CA the server trusts, and is refused without one."""
    password = secrets.token_urlsafe(16)
    monkeypatch.setenv("X509_PASSWORD", password)
    with (
        pymysql.connect(**mariadb_tls.admin_connect_kwargs(), autocommit=True) as admin,
        admin.cursor() as cursor,
    ):
        cursor.execute("SET sql_log_bin = 0")  # the password stays out of the binlog
        cursor.execute("CREATE USER 'x509'@'%%' IDENTIFIED BY %s REQUIRE X509", (password,))
        try:
            cert, key = ca.client_cert("x509")
            section = {
                "name": "x509",
                "dsn": f"mysql://x509@{LOOPBACK}:{mariadb_tls.port}",
                "tables": ["shop.orders"],
                "password_env": "X509_PASSWORD",
                "ssl_ca": str(ca.ca_file),
            }
            with_cert = {**section, "ssl_cert": str(cert), "ssl_key": str(key)}
            with (
                MysqlSourceConfig.from_section(with_cert).connect() as conn,
                conn.cursor() as session,
            ):
                session.execute("SHOW STATUS LIKE 'Ssl_cipher'")
                row = session.fetchone()
            assert row is not None and row[1], "the session is encrypted"
            # Refused, not an outage: no retry brings the certificate.
            with pytest.raises(SourceError, match=r"refuses the login.*Access denied") as refused:
                MysqlSourceConfig.from_section(section).connect()
            assert not isinstance(refused.value, SourceUnavailable)
        finally:
            cursor.execute("DROP USER 'x509'@'%'")
