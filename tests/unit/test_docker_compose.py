"""docker/compose.yaml agrees with the project: nothing here runs Docker (there is no engine on
our machines), so this is what keeps the stack from drifting away from the code.

The servers run with the settings the tests' servers use (devservices), the tailers' TOML files
parse with the project's own loader and every secret they name is set in the service that
mounts them, the `dblog` and `airflow` commands are ones the CLIs accept, every mounted file
exists, the Airflow connection matches the TOML as the hook checks it, and every `${VAR}` the
file interpolates is in docker/.env.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_dblog.cli import build_parser
from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.demo.postgres import TABLES as DEMO_TABLES
from airflow_provider_dblog.devservices import mariadb, postgres, redis
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.setup import check_grants
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig

DOCKER = Path(__file__).resolve().parents[2] / "docker"
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
CONFIG_IN_CONTAINER = "/etc/dblog/dblog.toml"


def _dotenv() -> dict[str, str]:
    values = {}
    for line in (DOCKER / ".env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def _interpolated(text: str, values: dict[str, str]) -> str:
    """Compose's `${VAR}` substitution, `$$` a literal dollar."""
    return re.sub(r"\$\$|\$\{(\w+)\}", lambda m: "$" if m[0] == "$$" else values[m[1]], text)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load(_interpolated((DOCKER / "compose.yaml").read_text(), _dotenv()))
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def _mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of each volume: a host path relative to docker/, or a volume name."""
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        yield source, target


def _host_file(service: dict[str, Any], target: str) -> Path:
    sources = [source for source, at in _mounts(service) if at == target]
    assert len(sources) == 1, f"{target} is mounted {len(sources)} times"
    return (DOCKER / sources[0]).resolve()


def _tailers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in services.items()
        if service.get("command", [])[:2] == ["dblog", "tail"]
    }


def _config_of(service: dict[str, Any]) -> Config:
    return load_config(_host_file(service, CONFIG_IN_CONTAINER))


def test_the_interpolated_variables_are_exactly_those_of_the_env_file() -> None:
    used = set(re.findall(r"\$\{(\w+)\}", (DOCKER / "compose.yaml").read_text()))
    assert used == set(_dotenv())


def test_every_bind_mounted_file_exists(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for source, _ in _mounts(service):
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is missing"


def test_postgres_runs_with_the_source_settings_of_the_test_servers(
    services: dict[str, dict[str, Any]],
) -> None:
    service = services["postgres"]
    major = postgres.SYSTEM_BIN_DIR.parent.name
    assert service["image"] == f"postgres:{major}"
    command = service["command"]
    assert command[0] == "postgres"
    flags, settings = command[1::2], dict(s.split("=", 1) for s in command[2::2])
    assert set(flags) == {"-c"}
    assert settings == postgres.SOURCE_SETTINGS
    assert service["ports"] == ["5432:5432"]


def test_postgres_lets_replication_in_as_the_test_servers_do(
    services: dict[str, dict[str, Any]],
) -> None:
    """`all` in pg_hba.conf does not cover replication connections: both add a line for them,
    with the same password method (the compose one from any address of the stack's network)."""
    hba = [line.split() for line in postgres.PG_HBA.splitlines()]
    (tested,) = [line for line in hba if line[:2] == ["host", "replication"]]
    initdb = "/docker-entrypoint-initdb.d/10-allow-replication.sh"
    script = _host_file(services["postgres"], initdb).read_text()
    appended = re.findall(r'echo "(host replication [^"]+)" >> "\$PGDATA/pg_hba.conf"', script)
    assert [line.split() for line in appended] == [[*tested[:3], "all", tested[4]]]


def test_mariadb_runs_with_the_binlog_options_of_the_test_servers(
    services: dict[str, dict[str, Any]],
) -> None:
    command = services["mariadb"]["command"]
    assert command[: len(mariadb.BINLOG_OPTIONS)] == mariadb.BINLOG_OPTIONS
    rest = [o for o in command[len(mariadb.BINLOG_OPTIONS) :] if not o.startswith("--server-id")]
    assert set(rest) <= set(mariadb.COMMON_OPTIONS)
    assert services["mariadb"]["environment"]["MARIADB_USER"] == "dblog"


def test_mariadb_is_a_version_the_mysql_source_supports(
    services: dict[str, dict[str, Any]],
) -> None:
    name, _, tag = services["mariadb"]["image"].partition(":")
    assert name == "mariadb"
    assert tuple(int(n) for n in tag.split(".")) >= (10, 6)  # see MysqlSourceConfig


def test_every_program_of_ours_runs_from_the_image_built_from_this_repository(
    services: dict[str, dict[str, Any]],
) -> None:
    ours = {"dblog", "airflow", "spark-class", "python"}
    for name, service in services.items():
        if service.get("command", [None])[0] in ours:
            assert service["image"] == "dblog:latest", name
            assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
    assert (DOCKER / "Dockerfile").is_file()


def test_redis_runs_with_the_durability_of_the_test_servers(
    services: dict[str, dict[str, Any]],
) -> None:
    service = services["redis"]
    command = service["command"]
    assert command[:2] == ["redis-server", "/tmp/redis.conf"]
    assert command[2:] == [*redis.DURABILITY_OPTIONS, "--dir", "/data"]
    # The password reaches the server through its config file, never its command line.
    entry = " ".join(service["entrypoint"])
    assert "requirepass" in entry and "/tmp/redis.conf" in entry
    assert ("redis-data", "/data") in set(_mounts(service))


def test_each_source_has_an_active_and_a_standby_tailer(
    services: dict[str, dict[str, Any]],
) -> None:
    tailers = _tailers(services)
    by_source: dict[str, list[str]] = {}
    for name, service in tailers.items():
        args = build_parser().parse_args(service["command"][1:])
        assert args.config == CONFIG_IN_CONTAINER
        assert args.owner == name
        by_source.setdefault(_config_of(service).source.name, []).append(name)
    assert {source: len(names) for source, names in by_source.items()} == {
        "shop": 2,
        "shop_mysql": 2,
    }
    assert all(tailers[n].get("restart") == "unless-stopped" for n in tailers)


def test_each_tailer_publishes_its_metrics_on_a_port_of_its_own(
    services: dict[str, dict[str, Any]],
) -> None:
    published = []
    for name, service in _tailers(services).items():
        settings = _config_of(service).tailer
        assert settings.metrics_address == "0.0.0.0", name  # reachable from outside
        (mapping,) = service["ports"]
        host, container = mapping.rsplit(":", 1)
        assert int(container) == settings.metrics_port, name
        published.append(host)
    assert len(set(published)) == len(published)


def test_the_live_view_runs_on_the_store_and_only_this_machine_reaches_it(
    services: dict[str, dict[str, Any]],
) -> None:
    service = services["ui"]
    args = build_parser().parse_args(service["command"][1:])
    assert (service["command"][:2], args.config) == (["dblog", "ui"], CONFIG_IN_CONTAINER)
    assert args.address == "0.0.0.0"  # inside the container; published on loopback only
    assert service["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    assert _config_of(service).redis.password_env in service["environment"]


def test_every_secret_a_mounted_toml_names_is_set_where_it_is_mounted(
    services: dict[str, dict[str, Any]],
) -> None:
    mounting = {
        name: service
        for name, service in services.items()
        if any(target == CONFIG_IN_CONTAINER for _, target in _mounts(service))
    }
    assert {"tailer-a", "tailer-b", "ui", "spark-worker", "airflow-scheduler"} <= set(mounting)
    for name, service in mounting.items():
        config = _config_of(service)
        wanted = {config.source.password_env, config.redis.password_env}
        wanted |= {v for k, v in config.output.items() if k.endswith("_env")}
        missing = wanted - {None} - set(service.get("environment", {}))
        assert not missing, f"{name} mounts a TOML naming {missing}, which it does not set"


def test_the_tomls_point_at_the_stack_s_own_services(services: dict[str, dict[str, Any]]) -> None:
    for name, service in _tailers(services).items():
        config = _config_of(service)
        source = config.source
        if isinstance(source, PostgresSourceConfig):
            params = conninfo_to_dict(source.dsn)
            host, port = params["host"], int(params["port"])
            assert source.tables == DEMO_TABLES  # what docker/setup_demo_source.py seeds
        else:
            assert isinstance(source, MysqlSourceConfig)
            host, port = source.host, source.port
            sql = (DOCKER / "mariadb" / "10-dblog-source.sql").read_text()
            assert all(f"CREATE TABLE {t}" in sql for t in source.tables), name
        assert f"{port}:{port}" in services[host]["ports"], f"{name}: {host}:{port}"
        url = urlsplit(config.redis.url)
        assert url.hostname in services and url.port == 6379
        if config.output["type"] == "redis_stream":
            # A Redis Stream on the stack's Redis, apart from the state.
            stream = urlsplit(service["environment"][config.output["url_env"]])
            assert (stream.hostname, stream.port) == (url.hostname, url.port)
            assert stream.path != url.path
            assert stream.password == service["environment"][config.redis.password_env]
        else:
            assert config.output["type"] == "ndjson"
            directory = config.output["directory"]
            assert any(target == directory for _, target in _mounts(service)), name


def test_the_mariadb_user_has_the_grants_the_preflight_asks_for() -> None:
    sql = (DOCKER / "mariadb" / "10-dblog-source.sql").read_text()
    (granted,) = re.findall(r"GRANT (.+) ON \*\.\* TO 'dblog'@'%'", sql)
    check_grants("'dblog'@'%'", {p.strip() for p in granted.split(",")})
    assert "ALL" not in granted and "SUPER" not in granted


def test_the_source_setup_runs_the_script_the_image_holds(
    services: dict[str, dict[str, Any]],
) -> None:
    command = services["source-setup"]["command"]
    script = Path(command[1])
    assert command[0] == "python" and script.parent == Path("/opt/dblog/docker")
    assert (DOCKER / script.name).is_file()
    copies = re.findall(r"^COPY (\S+) (\S+)$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert (f"docker/{script.name}", f"./docker/{script.name}") in copies
    # The tailers start only once the source is set up (they refuse unknown tables).
    for service in _tailers(services).values():
        if "source-setup" in service["depends_on"]:
            condition = service["depends_on"]["source-setup"]["condition"]
            assert condition == "service_completed_successfully"


def test_spark_master_and_worker_are_the_standalone_cluster_airflow_submits_to(
    services: dict[str, dict[str, Any]],
) -> None:
    master = services["spark-master"]["command"]
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    port = master[master.index("--port") + 1]
    worker = services["spark-worker"]["command"]
    assert worker[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    assert worker[-1] == f"spark://spark-master:{port}"
    spark = json.loads(services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert (spark["conn_type"], spark["host"], str(spark["port"])) == (
        "spark",
        "spark://spark-master",
        port,
    )


def test_airflow_runs_its_four_components_on_the_mounted_dags(
    services: dict[str, dict[str, Any]],
) -> None:
    for component in AIRFLOW_COMPONENTS:
        service = services[f"airflow-{component}"]
        assert service["command"] == ["airflow", component]
        env = service["environment"]
        assert _host_file(service, env["AIRFLOW__CORE__DAGS_FOLDER"]) == DOCKER.parent / "dags"
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == (
            "http://airflow-api-server:8080/execution/"
        )
        assert service["depends_on"]["airflow-init"]["condition"] == (
            "service_completed_successfully"
        )
    # dblog_on_change watches captured tables of the source on the Redis Stream output.
    scheduler = services["airflow-scheduler"]
    config = load_config(_host_file(scheduler, CONFIG_IN_CONTAINER))
    env = scheduler["environment"]
    assert env["DBLOG_SOURCE_NAME"] == config.source.name
    watched = {TableRef.parse(t) for t in env["DBLOG_WATCH_TABLES"].split(",")}
    assert watched <= set(config.source.tables)
    assert config.output["type"] == "redis_stream"
    assert services["airflow-init"]["command"] == ["airflow", "db", "migrate"]
    # Tasks, Spark drivers included, run in the scheduler: the executors call it by this name.
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"
    assert services["airflow-api-server"]["ports"] == ["8080:8080"]
    # One JWT secret for all, or the components reject each other's tokens.
    envs = [services[f"airflow-{c}"]["environment"] for c in AIRFLOW_COMPONENTS]
    secrets = {env["AIRFLOW__API_AUTH__JWT_SECRET"] for env in envs}
    assert len(secrets) == 1


def test_the_airflow_connection_is_the_one_the_hook_accepts_with_the_toml(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    service = services["airflow-scheduler"]
    env = service["environment"]
    connection = json.loads(env["AIRFLOW_CONN_DBLOG_DEFAULT"])
    # The hook reads the TOML where the container sees it: here, the file mounted there.
    config_path = connection["extra"]["config_path"]
    connection["extra"]["config_path"] = str(_host_file(service, config_path))
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_COMPOSE", json.dumps(connection))
    hook = DBLogHook("dblog_compose")
    assert hook.config.source.name == "shop"  # raises if the TOML names another source or Redis
    secrets = hook.secret_env()
    assert secrets == {name: env[name] for name in secrets}
    assert set(secrets) == {"DBLOG_SOURCE_PASSWORD", "DBLOG_REDIS_PASSWORD"}


def test_no_password_is_on_a_command_line(services: dict[str, dict[str, Any]]) -> None:
    passwords = set(_dotenv().values())
    for name, service in services.items():
        words = [*service.get("command", []), *service.get("entrypoint", [])]
        words += [w for h in [service.get("healthcheck", {}).get("test", [])] for w in h]
        text = shlex.join(str(w) for w in words)
        assert not any(p in text for p in passwords), f"{name} has a password on its command"
