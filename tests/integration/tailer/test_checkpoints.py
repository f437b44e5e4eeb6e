"""How often the tailer saves its checkpoint: at most every `checkpoint_s` (a Redis round trip a
transaction cost small transactions most of their read), and past the last commit once the log
is idle, so a tailer stopped there starts again where it stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import Op
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings
from tests.integration.e2e_support import (
    Databases,
    drop_databases,
    make_databases,
    wait_caught_up,
    wait_until,
)

pytestmark = pytest.mark.integration
TRANSACTIONS = 300
CHECKPOINT_S = 1.0


@pytest.fixture
def source(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 0, target=False, seed_value=0)
    yield databases
    drop_databases(databases)


def test_a_stream_of_small_transactions_saves_few_checkpoints_and_the_last_one(
    source: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """300 one-row transactions committed one after another are all written, with a checkpoint
    saved at most once a `checkpoint_s` (without that pause the tailer saved one every few
    commits: 84 in a fifth of a second); once the log is idle, the checkpoint and the slot
    stand past the last of them."""
    dbs = source
    dbs.source.ensure_setup()
    store = StateStore(redis_server.client(), dbs.config.name)
    saves: list[int] = []
    save_checkpoint = store.tailer.save_checkpoint

    def counted(commit: int, token: int, resume: str | None = None) -> None:
        saves.append(commit)
        save_checkpoint(commit, token, resume)

    store.tailer.save_checkpoint = counted  # type: ignore[method-assign]
    output = NdjsonOutput(tmp_path / "events")
    settings = TailerSettings(checkpoint_s=CHECKPOINT_S, heartbeat_s=0.2)
    tailer = Tailer(dbs.source, store, output, owner="checkpoints", settings=settings)
    stop = threading.Event()
    thread = threading.Thread(target=tailer.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer leading")
        saved_before, started = len(saves), time.monotonic()
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            for i in range(1, TRANSACTIONS + 1):
                conn.execute(
                    "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, 'o', 1, true)",
                    (i,),
                )
        writing_s = time.monotonic() - started
        wait_caught_up(dbs)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive(), "the tailer stopped"
    events = read_events(tmp_path / "events")
    inserts = [e for e in events if e.source.table == "accounts" and e.op is Op.CREATE]
    assert len(inserts) == TRANSACTIONS
    during = len(saves) - saved_before
    most = writing_s / CHECKPOINT_S + 2  # one a checkpoint_s, then the one at the idle log
    assert 1 <= during <= most, f"{during} checkpoint saves in {writing_s:.1f}s of writes"
    checkpoint = store.tailer.load_checkpoint()
    assert checkpoint is not None
    assert checkpoint >= max(e.source.position.commit for e in inserts)
