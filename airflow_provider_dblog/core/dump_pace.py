"""How fast a table's dump goes and when it will end: the pace `dblog dump` prints and `dblog
ui` shows, computed once here for both.

The pace is measured by whoever watches, from where the table stood when they first saw it
move: rows a resumed dump read in an earlier run never count in it. The ETA is the rows left,
as the share done (`estimated_fraction`) implies them, at that pace; unknown when the share is.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_dblog.core.dump_plan import TableProgress, integer_key


@dataclass
class TablePace:
    """One table's dump as a watcher saw it: where it stood at `since_s` (the watcher's clock)
    and at its last step."""

    since_s: float
    rows_at_start: int
    first: tuple[int, int] | None = None
    """(integer key, rows done) at the first step seen: the base of the rows-per-key estimate."""
    last_s: float | None = None
    """When the rows last moved."""
    rows: int = 0

    def __post_init__(self) -> None:
        self.rows = self.rows_at_start

    def step(self, progress: TableProgress, now_s: float) -> None:
        """The table's progress as seen at `now_s`."""
        key = integer_key(progress.after)
        if self.first is None and key is not None:
            self.first = (key, progress.rows_done)
        if progress.rows_done != self.rows:
            self.rows, self.last_s = progress.rows_done, now_s

    def rows_per_s(self, until_s: float | None = None) -> float | None:
        """Rows per second from `since_s` to `until_s` (default: the last step); None before
        any time has passed."""
        end = self.last_s if until_s is None else until_s
        if end is None or end <= self.since_s:
            return None
        return (self.rows - self.rows_at_start) / (end - self.since_s)


def eta_s(
    progress: TableProgress, fraction: float | None, rows_per_s: float | None
) -> float | None:
    """Seconds until the table is done at `rows_per_s`; None when done or not known."""
    if progress.done or not fraction or not rows_per_s:
        return None
    return progress.rows_done * (1 - fraction) / fraction / rows_per_s


def clock_text(seconds: float) -> str:
    """A duration as a clock reads it: `0:09`, `12:05`, `1:02:03`."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"
