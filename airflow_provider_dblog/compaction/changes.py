"""A compaction run's changes: its segments parsed and each key's changes folded, by Spark's
executors for a large backlog or in the driver for a few new bytes, behind one shape
(`RunChanges`). The functions the executors run live here, in the package Spark ships to them
(`spark_package`), and import no lake library: the workers need neither pyarrow nor deltalake."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_dblog.compaction.rules import TABLE_KEY, Change, Folded, fold, parse_line
from airflow_provider_dblog.compaction.segments import DEFAULT_SEGMENT_BYTES, Segment, read_segment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = dict[str, tuple[int, int]]
"""Per table, a position: its progress (events up to it are replays), or its floor."""
Committed = tuple[int, int] | None
"""The commit times (ms) of the oldest and the newest of some events; None if none has one."""


@dataclass
class RunChanges:
    """A run's parsed events: each touched table's last position, the number of events, the
    table-level events, the folded keys (given the run's floors), and the commit times (ms)
    of its oldest and newest events that carry one (`committed`; None if none does)."""

    ends: dict[str, tuple[int, int]]
    count: int
    table_events: list[tuple[str, Change]]
    folded: Callable[[Progress], Iterator[tuple[str, tuple[str, Folded]]]]
    committed: Committed = None
    close: Callable[[], object] = lambda: None


def spark_changes(spark: SparkSession, segments: list[Segment], progress: Progress) -> RunChanges:
    """Parse and fold on the executors, segments in parallel; the folded keys come back to
    the driver a partition at a time."""
    sc = spark.sparkContext
    parsed = (
        sc.parallelize(segments, _slices(sc.defaultParallelism, segments))
        .flatMap(read_segment)
        .flatMap(lambda line: parse_line(line, progress))
        .cache()
    )
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    count = 0
    committed: Committed = None
    for part_ends, part_count, part_events, part_committed in parsed.mapPartitions(
        _summary
    ).collect():
        for table, end in part_ends.items():
            ends[table] = max(ends.get(table, end), end)
        count += part_count
        events.extend(part_events)
        committed = _widened(committed, part_committed)

    def folded(truncated: Progress) -> Iterator[tuple[str, tuple[str, Folded]]]:
        rows = parsed.filter(lambda t: t[1] != TABLE_KEY).map(lambda t: ((t[0], t[1]), t[2]))
        return rows.groupByKey().flatMap(lambda kv: _folded(kv, truncated)).toLocalIterator()

    return RunChanges(ends, count, events, folded, committed, parsed.unpersist)


def driver_changes(segments: list[Segment], progress: Progress) -> RunChanges:
    """Parse and fold in this process: for a run whose new bytes are few, Spark's jobs would
    cost more than the work."""
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    keys: dict[tuple[str, str], list[Change]] = {}
    count = 0
    committed: Committed = None
    for segment in segments:
        for line in read_segment(segment):
            for table, key, change in parse_line(line, progress):
                count += 1
                ends[table] = max(ends.get(table, (0, 0)), (change.commit, change.seq))
                if change.ts_ms is not None:
                    committed = _widened(committed, (change.ts_ms, change.ts_ms))
                if key == TABLE_KEY:
                    events.append((table, change))
                else:
                    keys.setdefault((table, key), []).append(change)

    def folded(truncated: Progress) -> Iterator[tuple[str, tuple[str, Folded]]]:
        for item in keys.items():
            yield from _folded(item, truncated)

    return RunChanges(ends, count, events, folded, committed)


def _slices(parallelism: int, segments: list[Segment]) -> int:
    """Enough tasks to keep every core busy, more only for more data: a task per small file
    would cost more in scheduling than in reading."""
    total = sum(s.end - s.start for s in segments)
    return min(len(segments), max(parallelism, total // DEFAULT_SEGMENT_BYTES + 1))


def _summary(
    parsed: Iterable[tuple[str, str, Change]],
) -> Iterator[tuple[dict[str, tuple[int, int]], int, list[tuple[str, Change]], Committed]]:
    """One partition's part of a run: each table's last position, the number of changes, the
    table-level events and the commit times of the oldest and newest (one pass, no shuffle)."""
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    count = 0
    committed: Committed = None
    for table, key, change in parsed:
        count += 1
        ends[table] = max(ends.get(table, (0, 0)), (change.commit, change.seq))
        if change.ts_ms is not None:
            committed = _widened(committed, (change.ts_ms, change.ts_ms))
        if key == TABLE_KEY:
            events.append((table, change))
    yield ends, count, events, committed


def _widened(span: Committed, other: Committed) -> Committed:
    """The commit times spanning both."""
    if span is None or other is None:
        return span or other
    return min(span[0], other[0]), max(span[1], other[1])


def _folded(
    item: tuple[tuple[str, str], Any], truncated: Progress
) -> list[tuple[str, tuple[str, Folded]]]:
    (table, key), changes = item
    found = fold(changes, truncated.get(table))
    return [] if found is None else [(table, (key, found))]
