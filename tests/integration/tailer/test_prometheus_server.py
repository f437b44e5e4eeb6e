"""The real Prometheus server (Debian's `prometheus`, from scripts/install-system-deps.sh) on a
real `dblog tail`: the scrape job and alert rules of docker/prometheus/, pointed at the tailer's
metrics port, scraped every second while a dump runs, and asked through its HTTP API.

The unit tests (tests/unit/test_docker_monitoring.py) check the files with promtool and each
alert's logic on made-up series; this is the part they cannot show: that the figures Prometheus
holds are the tailer's, that every rule evaluates on the series a tailer really serves, with the
labels the scrape gives them, and that every panel of the dashboard is a query Prometheus takes.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port, log_tail
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.e2e_support import (
    REPO,
    Databases,
    TailProcess,
    cli_env,
    drop_databases,
    make_databases,
    wait_until,
    write_config,
)
from tests.integration.tailer.test_metrics import in_state, scrape, total

pytestmark = pytest.mark.integration

PROMETHEUS = REPO / "docker" / "prometheus"
DASHBOARD = REPO / "docker" / "grafana" / "dblog.json"
DEADLINE_S = 120
"""Generous: two shared cores may be busy with other tests' servers."""


@dataclass
class Prometheus:
    """A running `prometheus` on 127.0.0.1:`port`."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/`path`; its `data`, once Prometheus says `success`."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:  # a bad query: 400 with Prometheus's reason
            body = json.load(error)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The one value of a query, None when it has none."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None


@contextlib.contextmanager
def prometheus(work: Path, target_port: int, source: str) -> Iterator[Prometheus]:
    """docker/prometheus/'s tailer job and rules with one target, this tailer, labelled with
    its source; scraped and evaluated every second, its data in `work`."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is not installed: it comes with Debian's prometheus package, which "
            "scripts/install-system-deps.sh installs (run it as root)"
        )
    stack = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = [job for job in stack["scrape_configs"] if job["job_name"] == "dblog-tailer"]
    job["static_configs"] = [
        {"targets": [f"127.0.0.1:{target_port}"], "labels": {"source": source}}
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROMETHEUS / name) for name in stack["rule_files"]],
        "scrape_configs": [job],
    }
    config_file = work / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = work / "prometheus.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(port, process, log)
    try:
        wait_until(lambda: _ready(server), DEADLINE_S, "prometheus ready", interval_s=0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def _ready(server: Prometheus) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"prometheus exited:\n{log_tail(server.log)}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/-/ready", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _rules_evaluated(server: Prometheus, alerts: set[str]) -> bool:
    """Every rule of alerts.yml has been evaluated, without error."""
    rules = [rule for group in server.api("rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == alerts
    for rule in rules:
        assert rule["health"] != "err", rule
    return all(rule["health"] == "ok" for rule in rules)


def _alerts_in_stack() -> set[str]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"]}


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    """A private source with 300 rows per table before capture starts."""
    databases = make_databases(pg15, 300, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_prometheus_scrapes_a_tailer_during_a_dump_and_its_rules_read_what_it_serves(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Prometheus holds the tailer's figures: a closed window while the dump is still running
    (the dump waits for it, between two chunks), then the dump's chunks and rows exactly. Every
    rule evaluates without error, every dashboard query is one Prometheus takes, and once the
    tailer stops, the tailer-down and no-leader alerts are pending for its source."""
    store = StateStore(redis_server.client(), dbs.config.name)
    source = dbs.config.name
    selector = f'{{job="dblog-tailer", source="{source}"}}'
    port = free_port()
    config = write_config(
        tmp_path / "tailer.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"heartbeat_s": 0.2, "metrics_port": port},
    )
    tailer = TailProcess(config, "leader", cli_env(dbs, redis_server), tmp_path / "tailer.log")
    try:
        wait_until(lambda: in_state(port, "leading"), DEADLINE_S, "the tailer leading")
        with prometheus(tmp_path, port, source) as server:

            def leading_as_prometheus_holds_it() -> bool:
                leading = server.value(f'sum(dblog_tailer_state{{state="leading", {selector[1:]})')
                return leading == 1

            wait_until(leading_as_prometheus_holds_it, DEADLINE_S, "a leader in Prometheus")

            during: list[float] = []

            def closed_windows_scraped() -> bool:
                closed = server.value(f"sum(dblog_tailer_windows_closed_total{selector})")
                if closed is not None and closed >= 1:
                    during.append(closed)
                    return True
                return False

            def wait_for_a_scrape(dump_id: str, progress: TableProgress) -> None:
                """The first chunk done: hold the dump (no chunk in flight at parallelism 1)
                until Prometheus has scraped its window closed."""
                if during:
                    return
                wait_until(closed_windows_scraped, DEADLINE_S, "a window closed, in Prometheus")
                status = store.dumps.status(dump_id)
                assert status is not None and status.state is DumpState.RUNNING

            store.dumps.create(DumpRequest("p", DumpKind.ALL, TABLES, chunk_size=50))
            state = run_dump(store, dbs.source.chunk_source, "p", on_progress=wait_for_a_scrape)
            assert state == "done"
            status = store.dumps.status("p")
            assert status is not None
            assert during and during[0] < status.chunks, "scraped while the dump ran"

            # The tailer's own figures once it has emitted the last chunk, and Prometheus's.
            def emitted_all() -> bool:
                return total(scrape(port), "dblog_tailer_windows_closed_total") == status.chunks

            wait_until(emitted_all, DEADLINE_S, "every window closed, at the tailer")
            served = scrape(port)
            emitted = total(served, "dblog_tailer_chunk_rows_emitted_total")
            dropped = total(served, "dblog_tailer_chunk_rows_dropped_total")
            assert emitted + dropped == status.rows > 0

            def held(expr: str, expected: float) -> bool:
                return server.value(expr) == expected

            wait_until(
                lambda: (
                    held(f"sum(dblog_tailer_chunk_rows_emitted_total{selector})", emitted)
                    and held(f"sum(dblog_tailer_windows_closed_total{selector})", status.chunks)
                ),
                DEADLINE_S,
                "the dump's rows and chunks, in Prometheus",
            )
            per_table = server.query(
                f'sum by (schema, table) (dblog_tailer_events_total{{op="r", {selector[1:]})'
            )
            assert {(r["metric"]["schema"], r["metric"]["table"]) for r in per_table} == {
                (t.schema, t.name) for t in TABLES
            }

            alerts = _alerts_in_stack()
            wait_until(lambda: _rules_evaluated(server, alerts), DEADLINE_S, "every rule evaluated")
            firing = server.query('ALERTS{alertstate="firing"}')
            assert firing == [], "nothing is wrong with this tailer"

            board = json.loads(DASHBOARD.read_text())
            for panel in board["panels"]:
                for target in panel.get("targets", []):
                    expr = target["expr"].replace("$__rate_interval", "1m")
                    server.query(expr.replace("$source", source))  # asserts success
            rows = server.query(
                "sum by (schema, table) (rate(dblog_tailer_chunk_rows_emitted_total"
                f"{selector}[1m]))"
            )
            assert rows, "the dashboard's chunk rows/s have data after a dump"

            assert tailer.stop() == 0, (tmp_path / "tailer.log").read_text()

            def pending(alert: str) -> bool:
                found = server.query(f'ALERTS{{alertname="{alert}", alertstate="pending"}}')
                return [a["metric"].get("source") for a in found] == [source]

            wait_until(
                lambda: pending("DBLogTailerDown") and pending("DBLogNoLeader"),
                DEADLINE_S,
                "the tailer down and no leader, pending in Prometheus",
            )
    finally:
        tailer.stop()
