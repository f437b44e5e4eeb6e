"""The dump's retry budget on a fake clock: a source that is away is waited for, within a time
bound and without spending the window attempts; failed windows still run out of attempts; a read
replica behind pauses the chunk for as long as it takes, unless the dump is ending."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed
from airflow_provider_dblog.dump.retry import MAX_BACKOFF_S, ChunkRetries, Patience
from airflow_provider_dblog.dump.runner import ChunkLeft, DumpFailed, retry_chunk
from airflow_provider_dblog.sources.base import ReplicaBehind, SourceUnavailable
from airflow_provider_dblog.state import StateStoreUnavailable

DONE = ChunkOutcome(True, 10, (10,))


class Clock:
    """Time that moves only when the code under test sleeps (or an attempt takes time)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def scripted(clock: Clock, *steps: BaseException | ChunkOutcome) -> Callable[[], ChunkOutcome]:
    """An attempt that plays `steps` in order (each taking a second), then completes."""
    remaining = list(steps)

    def attempt() -> ChunkOutcome:
        clock.now += 1.0
        if not remaining:
            return DONE
        step = remaining.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    return attempt


def run(
    clock: Clock,
    attempt: Callable[[], ChunkOutcome],
    *,
    attempts: int = 5,
    patience_s: float = 300,
    paused: list[str] | None = None,
    ending: Callable[[], bool] = lambda: False,
) -> tuple[ChunkOutcome, list[str]]:
    retried: list[str] = []
    outcome = retry_chunk(
        attempt,
        ChunkRetries(attempts, Patience(patience_s, clock)),
        "chunk 3 of public.t",
        on_retry=retried.append,
        on_pause=(paused if paused is not None else []).append,
        ending=ending,
        sleep=clock.sleep,
    )
    return outcome, retried


def failed_window(reason: str = "window expired") -> ChunkOutcome:
    return ChunkOutcome(False, 0, None, reason)


def test_a_source_away_for_many_attempts_is_waited_for() -> None:
    """Thirty failures in a row (a minute of restart) are far more than the window attempts."""
    clock = Clock()
    away = [SourceUnavailable("terminating connection due to administrator command")] * 30
    outcome, retried = run(clock, scripted(clock, *away))
    assert outcome == DONE
    assert len(retried) == 30
    assert clock.sleeps[:4] == [0.25, 0.5, 1.0, 2.0] and max(clock.sleeps) == MAX_BACKOFF_S


def test_a_source_that_stays_away_fails_the_chunk_after_the_patience() -> None:
    clock = Clock()
    began = clock.now
    attempt = scripted(clock, *[SourceUnavailable("cannot connect: refused")] * 10_000)
    with pytest.raises(DumpFailed) as failed:
        run(clock, attempt, patience_s=120)
    # Away from the first failure (1 s in) until a try fails after the patience ran out: the
    # patience and at most one try (a second) more.
    assert began + 1 + 120 <= clock.now <= began + 1 + 120 + 1
    assert re.fullmatch(
        r"chunk 3 of public\.t: the source was unreachable for 12[01] s; "
        r"last error: cannot connect: refused",
        str(failed.value),
    )


def test_redis_away_is_named_as_such() -> None:
    clock = Clock()
    attempt = scripted(clock, *[StateStoreUnavailable("redis at x:1 cannot be reached")] * 500)
    with pytest.raises(
        DumpFailed, match=r"the state store was unreachable for 31 s; last error: redis at"
    ):
        run(clock, attempt, patience_s=30)


def test_source_failures_do_not_spend_the_window_attempts() -> None:
    """Four failed windows and long spells of the source away between them: the fifth window
    completes, as no spell lasted the patience and away attempts are not window attempts."""
    clock = Clock()
    away: list[BaseException | ChunkOutcome] = [SourceUnavailable("lost")] * 20
    steps = [*away, failed_window()] * 4 + away
    outcome, retried = run(clock, scripted(clock, *steps))
    assert outcome == DONE
    assert len(retried) == 4 + 5 * 20


def test_each_spell_away_gets_the_whole_patience() -> None:
    """Two spells of 80 s each, with a reached source between them, under 100 s of patience."""
    clock = Clock()
    spell = [SourceUnavailable("lost")] * 20  # 20 tries with backoff: over 80 s
    outcome, _ = run(clock, scripted(clock, *spell, failed_window(), *spell), patience_s=100)
    assert outcome == DONE
    assert clock.now - 1000.0 > 160


def test_failed_windows_run_out_of_attempts() -> None:
    clock = Clock()
    reasons = [failed_window(f"expired {n}") for n in range(5)]
    with pytest.raises(DumpFailed) as failed:
        run(clock, scripted(clock, *reasons))
    assert str(failed.value) == (
        "chunk 3 of public.t failed 5 times; last: expired 4. Is the tailer running (dblog status)?"
    )


def test_a_failed_read_is_a_failed_window_retried_after_a_backoff() -> None:
    """A Spark job that failed for another reason than the source spends a window attempt."""
    clock = Clock()
    failures = [ChunkReadFailed(f"the Spark job of chunk 3 failed ({n})") for n in range(3)]
    with pytest.raises(DumpFailed, match=r"failed 3 times; last: the Spark job .* \(2\)"):
        run(clock, scripted(clock, *failures), attempts=3)
    assert clock.sleeps == [0.25, 0.5]


def test_windows_the_tailer_failed_are_retried_over_seconds_not_in_a_burst() -> None:
    """A stale read fails its window while a commit is in the log but not yet visible; a
    retry at once would read while it still is not. Spread out, the attempts outlast it."""
    clock = Clock()
    stale = failed_window("stale_read: transaction 7 committed before lw but was invisible")
    outcome, retried = run(clock, scripted(clock, stale, stale, stale, stale))
    assert outcome == DONE and len(retried) == 4
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0]


BEHIND = ReplicaBehind("the read replica of src has replayed the WAL up to 0/3000000: 4096 short")


def test_a_replica_behind_far_longer_than_the_patience_pauses_the_chunk() -> None:
    """An hour behind (a replica whose replay its operator paused) under 120 s of patience: the
    chunk waits, says why each time, and spends no window attempt."""
    clock = Clock()
    paused: list[str] = []
    steps: list[BaseException | ChunkOutcome] = [BEHIND] * 720
    outcome, retried = run(clock, scripted(clock, *steps), patience_s=120, paused=paused)
    assert outcome == DONE
    assert clock.now - 1000.0 > 3600
    assert retried == [] and paused == [str(BEHIND)] * 720
    assert clock.sleeps[:3] == [0.25, 0.5, 1.0] and max(clock.sleeps) == MAX_BACKOFF_S


def test_a_replica_behind_ends_a_spell_of_the_source_away() -> None:
    """Two spells away of 80 s each under 100 s of patience, the replica answering between
    them (behind): the servers were reached, so the second spell gets the whole patience."""
    clock = Clock()
    spell: list[BaseException | ChunkOutcome] = [SourceUnavailable("lost")] * 20
    outcome, _ = run(clock, scripted(clock, *spell, BEHIND, *spell), patience_s=100)
    assert outcome == DONE


def test_pauses_spend_no_window_attempt() -> None:
    clock = Clock()
    steps: list[BaseException | ChunkOutcome] = [BEHIND, failed_window()] * 4 + [BEHIND] * 10
    outcome, retried = run(clock, scripted(clock, *steps), attempts=5)
    assert outcome == DONE and len(retried) == 4


def test_a_paused_chunk_of_a_dump_that_ends_is_left_unread() -> None:
    """Cancelled (or stopped) while its replica is behind: the chunk stops waiting at once,
    named, and nothing says it completed."""
    clock = Clock()
    checks: list[bool] = []

    def ending() -> bool:
        checks.append(len(checks) >= 3)
        return checks[-1]

    with pytest.raises(ChunkLeft, match=r"^chunk 3 of public\.t left unread, the dump ending: the"):
        run(clock, scripted(clock, *[BEHIND] * 100), ending=ending)
    assert len(checks) == 4
