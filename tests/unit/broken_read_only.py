"""Deliberately broken read-only windows: each breaks one rule of `state/positional.py`'s
protocol, and the generated histories must catch every one of them
(tests/unit/core/test_reconciler_properties.py).

Three are dumps and one a tailer: the model's `Dump` and `ModelTailer` with one step done
wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from airflow_provider_dblog.core.dump_plan import Chunk
from tests.unit.simulation import ChunkRead, Dump, Flight, ModelTailer


@dataclass
class ReadsBeforeArmed(Dump):
    """Broken (a): takes its snapshot as soon as it registers the window, before the tailer
    arms it, and stores that read once armed: lw lies after the snapshot, so a change between
    the two is in neither the read nor the window."""

    _early: dict[str, ChunkRead] = field(default_factory=dict)

    def _fly(self, chunk: Chunk) -> None:
        super()._fly(chunk)
        flight = self.flights[-1]
        if self.read_only is not None:
            self._early[flight.window.window_id] = super().read(flight)

    def read(self, flight: Flight) -> ChunkRead:
        early = self._early.pop(flight.window.window_id, None)
        return early if early is not None else super().read(flight)


@dataclass
class TakesHwBeforeReading(Dump):
    """Broken (c): takes hw (the log's end) when it sees the window armed, then reads later:
    the read may see commits at or above hw, which the tailer has not read when it closes the
    window there."""

    _hws: dict[str, int] = field(default_factory=dict)

    def armed(self, flight: Flight) -> None:
        self._hws[flight.window.window_id] = self.source.log_end

    def read(self, flight: Flight) -> ChunkRead:
        read = super().read(flight)
        hw = self._hws.pop(flight.window.window_id, None)
        if hw is None:
            return read
        exact = read.snapshot_end is not None  # MariaDB's snapshot end is its hw
        return replace(read, hw=hw, snapshot_end=hw if exact else None)


@dataclass
class ReadsALaggingReplica(Dump):
    """Broken (d): reads a replica that has not applied the last transaction yet, as of the
    commit before it, and takes hw from the primary: no transaction named, no snapshot end,
    so nothing tells the tailer the snapshot lies before lw."""

    def read(self, flight: Flight) -> ChunkRead:
        read = super().read(flight)
        if self.read_only is None:
            return read
        commits = [entry.commit for entry in self.source.log]
        applied = commits[-2] if len(commits) > 1 else 0
        lagging = self.source.read_at(flight.chunk, applied)
        return replace(lagging, hw=self.source.log_end)


class ArmsBehindItsRead(ModelTailer):
    """Broken (b): arms every window at the first read position of its session, one it has
    long passed, so the reconciler's lw lies behind changes already read: a transaction read
    before the window opened counts as after lw, and a read that missed it is not stale to the
    reconciler."""

    def _restart_at(self, commit: int) -> None:
        super()._restart_at(commit)
        self._first = 0

    def _poll_positional(self) -> None:
        self._first = self._first or self.delivered
        super()._poll_positional()

    def arm_at(self) -> int:
        return self._first
