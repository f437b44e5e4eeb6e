"""The dump's retry budget on a fake clock: a source that is away is waited for, within a time
bound and without spending the window attempts; failed windows still run out of attempts."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from airflow_provider_dblog.dump.chunk import ChunkOutcome, ChunkReadFailed
from airflow_provider_dblog.dump.retry import MAX_BACKOFF_S, ChunkRetries, Patience
from airflow_provider_dblog.dump.runner import DumpFailed, retry_chunk
from airflow_provider_dblog.sources.base import SourceUnavailable
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
    clock: Clock, attempt: Callable[[], ChunkOutcome], *, attempts: int = 5, patience_s: float = 300
) -> tuple[ChunkOutcome, list[str]]:
    retried: list[str] = []
    outcome = retry_chunk(
        attempt,
        ChunkRetries(attempts, Patience(patience_s, clock)),
        "chunk 3 of public.t",
        on_retry=retried.append,
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
    assert clock.sleeps == [0.25, 0.5, 1.0]
