"""A Redis failover that loses the last writes, during a dump under writes: the
replica stops applying the primary's writes (`RedisSentinelGroup.lag_replica`), the leading
tailer is frozen (SIGSTOP) until the standby takes its lease and writes with a new token, more
writes go by, then the primary is SIGKILLed and Sentinel promotes the replica, which lacks the
new leader's lease and token, the dump's latest progress and windows. The frozen leader wakes.

Afterwards no two tailers have had a batch accepted by the output with the same token, nor one
after another's with a token not larger (each tailer journals the batches its output accepted:
journaled_tailer.py); the dump completes, its status counting every chunk and row it counted
(though the replica lacked some of the counts); the NDJSON stream's positions strictly increase
and it replays to the source.

A seed picks the moment the replica starts lagging, when the leader freezes and how long the
writes go on before the kill; it is printed, and named in every failure. One random seed per
run; to run given seeds (10 in a row, say):

    DBLOG_FAILOVER_SEEDS=1,2,3,4,5,6,7,8,9,10 .venv/bin/python -m pytest \\
        tests/integration/redis_ha/test_lossy_failover.py
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis_sentinel import SERVICE_NAME, RedisSentinelGroup
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.outputs.ndjson import FENCE_FILE, LOCK_FILE
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.state.keys import SourceKeys
from tests.integration.e2e_support import (
    REDIS_PASSWORD_ENV,
    Databases,
    TailProcess,
    Writer,
    backwards,
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)
from tests.integration.redis_ha.journaled_tailer import JOURNALS_ENV
from tests.integration.redis_ha.support import answered, write_redis_config

pytestmark = pytest.mark.integration
SEEDS_ENV = "DBLOG_FAILOVER_SEEDS"
SEEDS = [int(seed) for seed in os.environ.get(SEEDS_ENV, "").split(",") if seed.strip()]
LEASE_TTL_MS = 3000


@dataclass(frozen=True)
class Plan:
    """What the seed picks."""

    chunks_before_lag: int
    """Dump chunks done when the replica starts lagging."""
    freeze_after_s: float
    """From then until the leader is frozen."""
    hold_output_s: float
    """How long the output's lock is held from the leader before it is frozen: a batch it
    made meanwhile waits, to be offered when it wakes."""
    writes_after_takeover_s: float
    """How long the new leader's writes go on (all lost) before the primary is killed."""

    @classmethod
    def of(cls, rng: random.Random) -> Plan:
        return cls(
            rng.randint(2, 6), rng.uniform(0.0, 1.0), rng.uniform(0.0, 0.5), rng.uniform(0.2, 3.0)
        )


@dataclass(frozen=True)
class Batch:
    owner: str
    token: int
    start: float
    end: float


@pytest.mark.parametrize("seed", SEEDS or [None], ids=lambda s: "random" if s is None else str(s))
def test_a_failover_that_loses_writes_leaves_one_writer_and_a_complete_dump(
    seed: int | None,
    pg15: PostgresInfo,
    redis_sentinels: RedisSentinelGroup,
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    plan = Plan.of(rng)
    print(f"lossy failover: seed {seed}, {plan}")
    why = f"(seed {seed}: {SEEDS_ENV}={seed} runs it again)"
    group = redis_sentinels
    dbs = make_databases(pg15, 160, target=False, seed_value=rng.randrange(1 << 30))
    try:
        _run(plan, rng, why, group, dbs, tmp_path)
    finally:
        drop_databases(dbs)


def _run(
    plan: Plan,
    rng: random.Random,
    why: str,
    group: RedisSentinelGroup,
    dbs: Databases,
    tmp_path: Path,
) -> None:
    events_dir = tmp_path / "events"
    journals = tmp_path / "journals"
    journals.mkdir()
    config = write_redis_config(
        tmp_path / "dblog.toml",
        dbs,
        [
            "sentinels = [" + ", ".join(f'"{h}:{p}"' for h, p in group.addresses) + "]",
            f'service_name = "{SERVICE_NAME}"',
        ],
        {"type": "ndjson", "directory": str(events_dir)},
        {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_s": 0.2, "window_ttl_s": 10},
    )
    env = dict(
        os.environ,
        **{dbs.password_env: dbs.password, REDIS_PASSWORD_ENV: group.password},
        **{JOURNALS_ENV: str(journals)},
    )
    client = group.settings().client(password=group.password)
    store = StateStore(client, dbs.config.name)
    keys = store.tailer.keys
    module = "tests.integration.redis_ha.journaled_tailer"
    tailers = {"a": TailProcess(config, "a", env, tmp_path / "a.log", module=module)}
    writer: Writer | None = None
    ended: list[DumpState | Exception] = []
    counted: dict[TableRef, TableProgress] = {}
    dumping = threading.Thread(
        target=lambda: ended.append(_dump(store, dbs.source.chunk_source, counted))
    )
    frozen: TailProcess | None = None
    try:
        wait_until(lambda: _leader(client, keys) is not None, 60, f"a leader {why}")
        # The standby once the leader set the source up (two setups at once could clash).
        tailers["b"] = TailProcess(config, "b", env, tmp_path / "b.log", module=module)
        writer = Writer(dbs, tmp_path, seed_value=rng.randrange(1000))
        writer.wait_for(10)
        store.dumps.create(
            DumpRequest("lossy", DumpKind.ALL, dbs.tables, chunk_size=20, parallelism=2)
        )
        # Chunks left for the lag: unthrottled, a tailer that catches up at once could let the
        # dump's 24 chunks end before the standby leads (the lag's progress would be none).
        store.dumps.throttle("lossy", delay_ms=400)
        dumping.start()
        wait_until(lambda: _chunks(store) >= plan.chunks_before_lag, 120, f"chunks {why}")

        replica = group.lag_replica()
        primary = group.primary()
        time.sleep(plan.freeze_after_s)  # the seed's moment, not a synchronisation
        old_leader = _leader(client, keys)
        assert old_leader is not None, why
        old_token = int(client.get(keys.tailer_token) or 0)
        frozen = tailers[old_leader]
        _freeze_outside_a_batch(frozen, events_dir, plan.hold_output_s)
        new_leader = "b" if old_leader == "a" else "a"

        def new_leader_wrote() -> bool:
            log = (tmp_path / f"{new_leader}.log").read_text()[-3000:]
            assert tailers[new_leader].alive(), (log, why)
            return any(b.token > old_token for b in _journal(journals, new_leader))

        wait_until(new_leader_wrote, 60, f"the standby leading and writing {why}")
        chunks_in_lag = _chunks(store)
        wait_until(lambda: _chunks(store) > chunks_in_lag, 60, f"a chunk done in the lag {why}")
        time.sleep(plan.writes_after_takeover_s)  # the seed's moment, not a synchronisation

        accepted_fence = int((events_dir / FENCE_FILE).read_text())
        chunks_at_kill = _chunks(store)
        primary_offset = group.offset(primary)
        replica_offset = group.offset(replica)
        killed = group.kill_primary()
        with replica.info.client() as lagged:  # still a replica: what Sentinel will promote
            lost_token = int(lagged.get(keys.tailer_token) or 0)
            lost_chunks = StateStore(lagged, dbs.config.name).dumps.status("lossy")
            role = lagged.info("replication")["role"]
        assert role == "slave", ("read the replica before its promotion", why)
        frozen.process.send_signal(signal.SIGCONT)
        frozen = None
        group.wait_for_failover(killed)
        # The promoted replica still has the delay.
        unthrottle = lambda: store.dumps.throttle("lossy", delay_ms=0)  # noqa: E731
        wait_until(lambda: answered(unthrottle), 60, f"the dump unthrottled {why}")

        dumping.join(300)
        status = store.dumps.status("lossy")
        assert ended == [DumpState.DONE], (ended, status, why)
        # The chunks whose counts the promoted replica lacked are counted all the same.
        assert status is not None, why
        assert (status.chunks, status.rows) == (
            sum(p.chunks_done for p in counted.values()),
            sum(p.rows_done for p in counted.values()),
        ), (status, counted, why)
        writer.stop()
        wait_caught_up(dbs, timeout_s=120)
        for name, tail in tailers.items():
            assert tail.stop() == 0, (name, (tmp_path / f"{name}.log").read_text()[-3000:], why)
    finally:
        if frozen is not None:
            frozen.process.send_signal(signal.SIGCONT)
        if writer is not None:
            writer.kill()
        for tail in tailers.values():
            if tail.alive():
                tail.kill()
        if dumping.ident is not None:
            dumping.join(60)
        group.heal()

    # The replica really missed the last writes, and they mattered.
    assert replica_offset < primary_offset, (replica_offset, primary_offset, why)
    assert lost_token < accepted_fence, ("the promoted token was not behind", why)
    assert lost_chunks is not None and lost_chunks.chunks < chunks_at_kill, (lost_chunks, why)

    batches = [b for name in tailers for b in _journal(journals, name)]
    refused = sum(line.count('"refused"') for line in _journal_texts(journals))
    print(
        f"lossy failover {why}: offsets {replica_offset} < {primary_offset}, token "
        f"{lost_token} < {accepted_fence}, chunks {lost_chunks.chunks} < {chunks_at_kill}, "
        f"{len(batches)} batches accepted, {refused} refused as fenced"
    )
    assert {b.owner for b in batches} == {"a", "b"}, ("both tailers led", why)
    assert _one_writer_at_a_time(batches) == [], why
    events = list(read_events(events_dir))
    assert backwards(events) == [], why
    assert state_differences(source_state(dbs.source), materialize(events)) == [], why


def _dump(
    store: StateStore,
    open_source: Callable[[], ChunkSource],
    counted: dict[TableRef, TableProgress],
) -> DumpState | Exception:
    """Run the dump; `counted` gets each table's progress as the dump itself counts it."""

    def count(_: str, progress: TableProgress) -> None:
        counted[progress.table] = progress

    try:
        return run_dump(store, open_source, "lossy", window_timeout_s=5, on_progress=count)
    except Exception as exc:  # the test names it
        return exc


def _leader(client: redis.Redis, keys: SourceKeys) -> str | None:
    owner = client.hget(keys.tailer_lease, "owner")
    return None if owner is None else owner.decode()


def _chunks(store: StateStore) -> int:
    status = store.dumps.status("lossy")
    return 0 if status is None else status.chunks


def _freeze_outside_a_batch(tail: TailProcess, events_dir: Path, hold_s: float) -> None:
    """SIGSTOP `tail` while it is not writing a batch: under the output's lock (which a writer
    holds for one batch), kept until every thread of it has stopped (one inside a system call
    stops on its way out, and could take the lock on the way), so that the new leader is not
    kept waiting for it."""
    with (events_dir / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        time.sleep(hold_s)  # the seed's, not a synchronisation
        tail.process.send_signal(signal.SIGSTOP)
        wait_until(lambda: _stopped(tail.process.pid), 30, "the tailer stopped")


def _stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (state T in /proc)."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            if stat.read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
                return False
    return True


def _journal_texts(journals: Path) -> list[str]:
    return [path.read_text() for path in journals.iterdir()]


def _journal(journals: Path, owner: str) -> list[Batch]:
    path = journals / f"{owner}.ndjson"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [Batch(owner, e["token"], e["start"], e["end"]) for e in entries if "token" in e]


def _one_writer_at_a_time(batches: list[Batch]) -> list[str]:
    """Batches accepted with a token another tailer's accepted batch had, or with one not
    larger than a token another tailer's batch was accepted with before it began."""
    wrong = []
    owners: dict[int, set[str]] = {}
    for batch in batches:
        owners.setdefault(batch.token, set()).add(batch.owner)
    wrong += [f"token {t} accepted from {sorted(o)}" for t, o in owners.items() if len(o) > 1]
    by_end = sorted(batches, key=lambda b: b.end)
    ends = [b.end for b in by_end]
    largest: dict[str, int] = {}
    seen = 0
    for batch in sorted(batches, key=lambda b: b.start):
        for earlier in by_end[seen : bisect.bisect_right(ends, batch.start)]:
            largest[earlier.owner] = max(largest.get(earlier.owner, 0), earlier.token)
        seen = max(seen, bisect.bisect_right(ends, batch.start))
        for owner, token in largest.items():
            if owner != batch.owner and token >= batch.token:
                wrong.append(f"{batch} accepted after {owner}'s token {token}")
    return wrong
