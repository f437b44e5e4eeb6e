"""Property-based histories against the model tailer: whatever the interleaving, the output is a
faithful change stream (see `histories.py` for what a history holds and what is checked).

The later tests run the same histories against deliberately broken reconcilers and dump
planners and require that hypothesis catches each of them. tests/integration/tailer/
test_properties.py plays the same histories against the production `Session`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.direct import DumpMode, tombstone_horizon
from airflow_provider_dblog.core.dump_plan import DumpKind, TablePlanner
from airflow_provider_dblog.core.reconciler import Reconciler
from tests.unit.broken_planners import (
    FilterDrivesLimitChunks,
    TakesASparseChunkAsTheLast,
)
from tests.unit.broken_read_only import (
    ArmsBehindItsRead,
    ReadsALaggingReplica,
    ReadsBeforeArmed,
    TakesHwBeforeReading,
)
from tests.unit.broken_reconcilers import (
    BROKEN_RECONCILERS,
    DirectRowsOverwriteEverything,
    horizon_without_pending_windows,
)
from tests.unit.histories import (
    Advance,
    DumpSpec,
    History,
    Horizon,
    Plan,
    Restart,
    Tail,
    Write,
    direct_histories,
    histories,
    mutant_search,
    read_only_histories,
    run_history,
)
from tests.unit.simulation import TABLE_A, TABLE_C, Dump, ModelTailer, ModelWindows, Source

EXAMPLES = int(os.environ.get("DBLOG_PROPERTY_EXAMPLES", "1000"))
MUTANT_EXAMPLES = 6000


def run_model(
    history: History,
    reconciler_class: type[Reconciler] = Reconciler,
    horizon: Horizon = tombstone_horizon,
    planner: type[TablePlanner] = TablePlanner,
    dump_class: type[Dump] = Dump,
    tailer_class: type[ModelTailer] = ModelTailer,
) -> None:
    windows = ModelWindows()

    def start_tailer(source: Source) -> ModelTailer:
        return tailer_class(source, windows, reconciler_class)

    run_history(
        history,
        windows,
        start_tailer,
        horizon=horizon,
        planner=planner,
        dump_class=dump_class,
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(histories)
def test_dump_with_concurrent_writes_converges(history: History) -> None:
    run_model(history)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(direct_histories)
def test_direct_dumps_and_the_log_converge_in_a_position_keyed_target(history: History) -> None:
    run_model(history)


@pytest.mark.parametrize("broken", BROKEN_RECONCILERS, ids=lambda c: c.__name__)
def test_broken_reconcilers_are_caught(broken: type[Reconciler]) -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(histories)
    def broken_run(history: History) -> None:
        run_model(history, broken)

    with pytest.raises(AssertionError):
        broken_run()


@pytest.mark.parametrize(
    ("broken", "failure"),
    [
        # Caught by the planner's own check, or by a row it left out never being dumped.
        pytest.param(
            TakesASparseChunkAsTheLast, "never read keys|never dumped", id="sparse-chunk-as-last"
        ),
        pytest.param(FilterDrivesLimitChunks, "paged by its filter", id="limit-chunks"),
    ],
)
def test_planners_that_page_by_the_filter_are_caught(
    broken: type[TablePlanner], failure: str
) -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(histories)
    def broken_run(history: History) -> None:
        run_model(history, planner=broken)

    with pytest.raises(AssertionError, match=failure):
        broken_run()


SPARSE_FIRST_CHUNK = History(
    initial=(
        Write((("upsert", TABLE_A, (2,), (2,)),)),  # version 1: matches
        Write((("upsert", TABLE_A, (1,), (1,)),)),  # version 2: does not
    ),
    dumps=(DumpSpec(DumpKind.TABLE, TABLE_A, 0, 1, 1, False, where="v % 2 = 1"),),
    actions=(),  # the dump runs to its end after the actions
)
"""What hypothesis shrinks `TakesASparseChunkAsTheLast`'s failures to: the first chunk, account
1, matches no row, and account 2, which matches, lies in the range after it."""


@pytest.mark.parametrize(
    ("planner", "caught"),
    [(TablePlanner, False), (TakesASparseChunkAsTheLast, True)],
    ids=["planner", "sparse-chunk-as-last"],
)
def test_a_row_after_a_sparse_chunk_is_dumped(planner: type[TablePlanner], caught: bool) -> None:
    @mutant_search(1)
    @given(st.just(SPARSE_FIRST_CHUNK))
    def play(history: History) -> None:
        run_model(history, planner=planner)

    if caught:
        with pytest.raises(AssertionError, match=r"\(2,\) present .* matching .*, never dumped"):
            play()
    else:
        play()


def test_rows_that_overwrite_everything_are_caught() -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(direct_histories)
    def broken_run(history: History) -> None:
        run_model(history, DirectRowsOverwriteEverything)

    with pytest.raises(AssertionError):
        broken_run()


DELETE_AFTER_HW_LANDS_FIRST = History(
    initial=(Write((("upsert", TABLE_A, (1,), (1,)),)),),
    dumps=(DumpSpec(DumpKind.TABLE, TABLE_A, 0, 6, 1, False, DumpMode.DIRECT),),
    actions=(
        Plan(0),  # the table's max key
        Plan(0),  # its one chunk in flight
        Advance(0, 0),  # lw
        Advance(0, 0),  # the read: account 1
        Advance(0, 0),  # hw
        Tail(2),  # the tailer records the window
        Write((("delete", TABLE_A, (1,), (1,)),)),  # after hw
        Write((("upsert", TABLE_C, (2,), (2,)),)),  # moves the checkpoint past the delete
        Tail(2),  # the delete reaches the target before the dump's rows
        Advance(0, 0),  # the dump writes account 1, positioned after hw
    ),
)
"""The race tombstones exist for, as one history: random search reaches it too rarely (five
steps in this order) to catch a horizon that ignores the pending windows."""


@pytest.mark.parametrize(
    ("horizon", "caught"),
    [(tombstone_horizon, False), (horizon_without_pending_windows, True)],
    ids=["horizon", "horizon-without-pending-windows"],
)
def test_a_horizon_that_ignores_pending_windows_is_caught_by_the_race(
    horizon: Horizon, caught: bool
) -> None:
    @mutant_search(1)
    @given(st.just(DELETE_AFTER_HW_LANDS_FIRST))
    def play(history: History) -> None:
        run_model(history, horizon=horizon)

    if caught:
        with pytest.raises(AssertionError, match="direct target does not equal the source"):
            play()
    else:
        play()


@pytest.mark.parametrize(
    ("dump_class", "tailer_class"),
    [
        pytest.param(ReadsBeforeArmed, ModelTailer, id="reads-before-armed"),
        pytest.param(Dump, ArmsBehindItsRead, id="arms-behind-its-read"),
        pytest.param(TakesHwBeforeReading, ModelTailer, id="hw-before-reading"),
        pytest.param(ReadsALaggingReplica, ModelTailer, id="lagging-replica"),
    ],
)
def test_broken_read_only_windows_are_caught(
    dump_class: type[Dump], tailer_class: type[ModelTailer]
) -> None:
    @mutant_search(MUTANT_EXAMPLES)
    @given(read_only_histories)
    def broken_run(history: History) -> None:
        run_model(history, dump_class=dump_class, tailer_class=tailer_class)

    with pytest.raises(AssertionError):
        broken_run()


REPLAY_INSIDE_A_READ_ONLY_WINDOW = History(
    initial=(
        Write((("upsert", TABLE_C, (1,), (1,)),)),  # commit 110
        Write((("upsert", TABLE_A, (1,), (1,)),)),  # commit 120: account 1, never written again
    ),
    dumps=(DumpSpec(DumpKind.TABLE, TABLE_A, 0, 6, 1, False, read_only="invisible"),),
    actions=(
        Restart(2),  # the source lost its acknowledgements: the next session reads from 0
        Plan(0),  # the table's max key
        Plan(0),  # its one chunk in flight: a read-only window registered
        Tail(1),  # 110 read again: the window is armed there, lw 110
        Advance(0, 0),  # the dump sees it armed
        Advance(0, 0),  # the read: account 1
        Advance(0, 0),  # ready
        Tail(1),  # 120 read again (a replay), inside the window: account 1 leaves the chunk
    ),
)
"""A restarted tailer reading again what an earlier session emitted must not arm a read-only
window there: a change it meets again would leave the chunk, and the output drop the change, so
account 1, untouched throughout the dump, would never be dumped. It arms only once it has read
up to the log's end of the moment it first met the window (`PositionalWindows._arm_from`)."""


def test_a_read_only_window_is_not_armed_among_replays() -> None:
    @mutant_search(1)
    @given(st.just(REPLAY_INSIDE_A_READ_ONLY_WINDOW))
    def play(history: History) -> None:
        run_model(history)

    play()
