"""A Redis that hands out a lease token an output already took (a failover to a replica that
missed the last tokens, a restore from an older AOF, a clock behind the old primary's) cannot
let two leaders pass the output's fence with one token: a new leader leads with a token above
the output's fence, and the old leader's token is refused."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import Op
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import NdjsonOutput, OutputFenced, read_events
from airflow_provider_dblog.outputs.ndjson import FENCE_FILE
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer
from tests.integration.e2e_support import drop_databases, make_databases, wait_until

pytestmark = pytest.mark.integration


def test_a_leader_given_an_old_token_leads_above_the_outputs_fence(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = make_databases(pg15, 0, target=False, seed_value=11)
    client = redis_server.client()
    store = StateStore(client, dbs.config.name)
    seconds, micros = client.time()
    old_token = seconds * 1000 + micros // 1000 + 10**9
    # An old leader wrote with `old_token`, handed out by a primary whose clock ran ahead; the
    # replica promoted since missed it: its last token is one short, and no lease is held.
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    (events_dir / FENCE_FILE).write_text(f"{old_token}\n")
    client.set(store.tailer.keys.tailer_token, old_token - 1)
    dbs.source.ensure_setup()
    tailer = Tailer(dbs.source, store, NdjsonOutput(events_dir), owner="new")
    stop = threading.Event()
    thread = tailer.start(stop)
    try:
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            insert = "INSERT INTO accounts (id, owner, balance, active) VALUES (1, 'o', 1, true)"
            conn.execute(insert)

        def inserted() -> bool:
            return any(e.op is Op.CREATE for e in read_events(events_dir))

        wait_until(inserted, 60, "the new leader writing the insert")
        token = tailer.stats.lease_token
    finally:
        stop.set()
        thread.join(60)
        drop_databases(dbs)
    assert token > old_token, "a new leader never leads with a token an output already took"
    assert NdjsonOutput(tmp_path / "check").fence(dbs.config.name) is None
    with NdjsonOutput(events_dir) as old_leader:
        assert old_leader.fence(dbs.config.name) == token
        with pytest.raises(OutputFenced):
            old_leader.write(list(read_events(events_dir)), old_token)
