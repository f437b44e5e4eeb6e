"""A dump's progress as its task log shows it while the dump runs: a line per table that moved,
with the rows done, the rate, the share done and the time left.

The pace, the share and the ETA are computed as `dblog dump` prints them and `dblog ui` shows
them (`core.dump_pace`, `estimated_fraction`): measured from where each table stood when this
watcher first saw it, so rows an earlier try of the task read do not inflate the rate, and the
ETA is unknown while the share is (a key that is not one integer column) or the rate is
(nothing read yet): a line then says nothing of it.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_dblog.core.dump_pace import TablePace, clock_text, eta_s
from airflow_provider_dblog.core.dump_plan import TableProgress, estimated_fraction
from airflow_provider_dblog.core.event import TableRef


class ProgressLines:
    """Turns the progress read at each poll into the lines worth logging.

    :param keys_requested: the keys of a dump of given keys (its share done is known), else 0.
    """

    def __init__(self, keys_requested: int) -> None:
        self._keys_requested = keys_requested
        self._paces: dict[TableRef, TablePace] = {}
        self._shown: dict[TableRef, TableProgress] = {}

    def moved(self, progress: Mapping[TableRef, TableProgress], now_s: float) -> list[str]:
        """A line for each table whose progress moved since the last call (all at the first)."""
        lines = []
        for table, current in progress.items():
            if self._shown.get(table) == current:
                continue
            self._shown[table] = current
            pace = self._paces.setdefault(table, TablePace(now_s, current.rows_done))
            pace.step(current, now_s)
            lines.append(self._line(current, pace))
        return lines

    def _line(self, progress: TableProgress, pace: TablePace) -> str:
        table = progress.table
        if progress.done:
            return f"{table}: done, {progress.rows_done:,} rows"
        if not progress.started:
            return f"{table}: waiting"
        parts = [f"{progress.rows_done:,} rows"]
        rate = pace.rows_per_s()
        if rate is not None:
            parts.append(f"{rate:,.1f} rows/s" if rate < 10 else f"{rate:,.0f} rows/s")
        fraction = estimated_fraction(progress, self._keys_requested, pace.first)
        if fraction is not None:
            parts.append(f"{fraction:.0%}")
        eta = eta_s(progress, fraction, rate)
        if eta is not None:
            parts.append(f"ETA {clock_text(eta)}")
        return f"{table}: {', '.join(parts)}"
