"""`dblog lake compact --follow` as a process, on a real Redis and real Delta tables read back
with DuckDB: it folds the events written after it started, lets `dblog lake maintain` run
between its runs, serves its freshness (which moves with the commit times of what it folds),
beats for `dblog status` and stops cleanly on SIGTERM, giving its lease up; of two followers of
one source only the lease holder folds, and the standby takes over once the leader is killed.

The lake's tables are made by a first batch run (without a catalog: from the stream's schema
events) before the followers start, so their runs never need the source's catalog and the TOML's
source is never connected to."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.compaction.run import compact
from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore
from tests.integration.browser import Page, chromium
from tests.integration.compaction.test_spark_compact import Stream, expected, found, write
from tests.integration.e2e_support import wait_until

pytestmark = pytest.mark.integration

REDIS_PASSWORD_ENV = "FOLLOW_REDIS_PASSWORD"
DEADLINE_S = 90
DBLOG = (sys.executable, "-m", "airflow_provider_dblog.cli")


@dataclass
class Lake:
    """A source's event directory and lake, its TOML, and the stream written into them."""

    config: Path
    events: Path
    root: Path
    store: StateStore
    env: dict[str, str]
    stream: Stream

    def write(self, transactions: int, committed_ago_s: float = 0.0) -> None:
        """Events of `transactions` more transactions, committed `committed_ago_s` ago."""
        batch = self.stream.batch(transactions)
        stamp(batch, int((time.time() - committed_ago_s) * 1000))
        write(self.events, batch, [])

    def folded(self) -> bool:
        return found(self.root) == expected(self.stream)

    def dblog(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DBLOG, *args, "--config", str(self.config)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@contextmanager
def live_view(lake: Lake, tmp_path: Path) -> Iterator[Page]:
    """`dblog ui` on the lake's source, open in a headless Chromium."""
    port = free_port()
    with (tmp_path / "ui.log").open("w") as out:
        process = subprocess.Popen(
            [*DBLOG, "ui", "--config", str(lake.config), "--port", str(port), "--interval", "0.2"],
            env=lake.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert process.poll() is None, (tmp_path / "ui.log").read_text()
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/api/snapshot", timeout=5) as response,
        ):
            return bool(response.status == 200)
        return False

    try:
        wait_until(serving, DEADLINE_S, "dblog ui serving")
        with chromium(tmp_path) as page:
            page.navigate(f"{url}/")
            yield page
    finally:
        process.terminate()
        process.wait(timeout=30)


def stamp(events: list[Event], ts_ms: int) -> None:
    for event in events:
        event.source.ts_ms = ts_ms


@pytest.fixture
def lake(redis_server: RedisInfo, tmp_path: Path) -> Lake:
    source = f"follow_{uuid.uuid4().hex[:8]}"
    events, root = tmp_path / "events", tmp_path / "lake"
    config = tmp_path / "dblog.toml"
    config.write_text(
        "\n".join(
            [
                "[source]",
                'type = "postgres"',
                f'name = "{source}"',
                'dsn = "host=127.0.0.1 port=1 dbname=unused user=unused"',
                'tables = ["app.users", "app.items"]',
                "[redis]",
                f'url = "redis://{redis_server.host}:{redis_server.port}/{redis_server.db}"',
                f'password_env = "{REDIS_PASSWORD_ENV}"',
                "[output]",
                'type = "ndjson"',
                f'directory = "{events}"',
                "[lake]",
                f'root = "{root}"',
            ]
        )
    )
    env = dict(os.environ, **{REDIS_PASSWORD_ENV: redis_server.password})
    made = Lake(config, events, root, StateStore(redis_server.client(), source), env, Stream(5))
    made.write(20)
    compact(None, events, root)  # the tables, from the stream's schema events
    assert made.folded()
    return made


class Follower:
    """A `dblog lake compact --follow` process with its metrics port."""

    def __init__(self, lake: Lake, owner: str, log: Path) -> None:
        self.owner, self.port, self.log = owner, free_port(), log
        # A lease long enough that a leader starved of CPU on a loaded machine keeps it (the
        # standby would fold too early), short enough that a takeover after a kill is quick.
        args = ["--follow", "--interval", "0.2", "--lease-ttl-ms", "8000"]
        args += ["--owner", owner, "--metrics-port", str(self.port), "--config", str(lake.config)]
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [*DBLOG, "lake", "compact", *args],
                env=lake.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def metrics(self) -> dict[str, float]:
        """The samples it serves, by name and labels; {} while it does not answer yet."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return {}
        return {
            sample.name
            + "".join(f",{k}={v}" for k, v in sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def said(self) -> str:
        return self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def followers(tmp_path: Path) -> Iterator[list[Follower]]:
    started: list[Follower] = []
    yield started
    for follower in started:
        follower.stop()


def test_follow_folds_new_events_beside_maintenance_and_stops_on_sigterm(
    lake: Lake, followers: list[Follower], tmp_path: Path
) -> None:
    follower = Follower(lake, "follower-a", tmp_path / "a.log")
    followers.append(follower)
    wait_until(
        lambda: follower.metrics().get("dblog_compact_lease_token", 0) > 0,
        DEADLINE_S,
        "the follower taking the lease",
    )
    lake.write(40)
    wait_until(lake.folded, DEADLINE_S, "the follower folding the events written after it started")
    wait_until(
        lambda: "dblog_compact_freshness_seconds" in follower.metrics(),
        DEADLINE_S,
        "the freshness of the fold served",
    )
    fresh = follower.metrics()["dblog_compact_freshness_seconds"]
    assert 0 <= fresh < 60, follower.said()

    maintained = lake.dblog("lake", "maintain", "--lock-timeout", "120")
    assert maintained.returncode == 0, maintained.stderr + follower.said()
    assert "app.users:" in maintained.stdout and "app.items:" in maintained.stdout

    lake.write(30, committed_ago_s=600)  # committed ten minutes ago: a stale lake
    wait_until(lake.folded, DEADLINE_S, "the follower folding after the maintenance")
    wait_until(
        lambda: follower.metrics()["dblog_compact_freshness_seconds"] >= 600,
        DEADLINE_S,
        "the freshness moving to the age of the last events folded",
    )
    served = follower.metrics()
    assert served["dblog_compact_events_total"] > 0
    assert served["dblog_compact_pending_bytes"] == 0
    assert served["dblog_compact_state,state=leading"] == 1

    status = lake.dblog("status", "--json")
    assert status.returncode == 0, status.stderr
    folding = json.loads(status.stdout)["compaction"]
    assert folding["owner"] == "follower-a" and folding["metrics"]["freshness_s"] >= 600
    status = lake.dblog("status")
    assert status.returncode == 0, status.stderr
    (line,) = [x for x in status.stdout.splitlines() if x.startswith("compaction: ")]
    assert line.startswith("compaction: follower-a, heartbeat") and "freshness 6" in line, line
    with live_view(lake, tmp_path) as page:
        shown = page.wait(
            "document.querySelector('#compaction:not([hidden])')?.textContent",
            "the live view showing the compaction",
        )
    assert shown.startswith("lake follower-a folds · freshness 6"), shown

    follower.process.send_signal(signal.SIGTERM)
    assert follower.process.wait(timeout=DEADLINE_S) == 0, follower.said()
    assert lake.store.compactor.lease.acquire("probe", 1000) is not None, "lease kept"


def test_a_standby_follower_takes_over_when_the_leader_is_killed(
    lake: Lake, followers: list[Follower], tmp_path: Path
) -> None:
    leader = Follower(lake, "follower-a", tmp_path / "a.log")
    followers.append(leader)
    wait_until(
        lambda: leader.metrics().get("dblog_compact_lease_token", 0) > 0,
        DEADLINE_S,
        "the first follower taking the lease",
    )
    standby = Follower(lake, "follower-b", tmp_path / "b.log")
    followers.append(standby)
    wait_until(
        lambda: standby.metrics().get("dblog_compact_state,state=standby") == 1,
        DEADLINE_S,
        "the second follower standing by",
    )
    lake.write(40)
    # the lake shows the rows a moment before the run that wrote them is counted
    wait_until(
        lambda: lake.folded() and leader.metrics()["dblog_compact_runs_total,outcome=folded"] >= 1,
        DEADLINE_S,
        "the leader folding",
    )
    leader_token = leader.metrics()["dblog_compact_lease_token"]
    on_standby = standby.metrics()
    assert on_standby["dblog_compact_runs_total,outcome=folded"] == 0, standby.said()
    assert on_standby["dblog_compact_lease_token"] == 0

    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(timeout=30)
    lake.write(30)
    wait_until(
        lambda: lake.folded() and standby.metrics()["dblog_compact_runs_total,outcome=folded"] >= 1,
        DEADLINE_S,
        "the standby taking over and folding",
    )
    taken = standby.metrics()
    assert taken["dblog_compact_lease_token"] > leader_token, standby.said()
    health = lake.store.compactor.health()
    assert health is not None and health.owner == "follower-b"
