"""How `dblog dump` shows its progress: a bar per table redrawn in place on a terminal, one
plain line per step otherwise (a log file, a pipe, CI).

The progress itself is the dump's (`TableProgress`, saved after each chunk by the runner and
handed to `update`), and how far a table is comes from `estimated_fraction` beside it, as
`dblog ui` shows it: known for a dump of given keys, estimated for a table whose key is one
integer column, unknown otherwise (then no share and no ETA are shown). The pace and the ETA
are `core.dump_pace`'s, as the live view's: rows/s counts the rows this run read of the table,
and the ETA is the rows left at that pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

from airflow_provider_dblog.core.dump_pace import TablePace, clock_text, eta_s
from airflow_provider_dblog.core.dump_plan import DumpRequest, TableProgress, estimated_fraction
from airflow_provider_dblog.core.event import TableRef

BAR_WIDTH = 24


@dataclass(frozen=True)
class TableLine:
    """What one line shows about one table."""

    table: TableRef
    rows: int
    rows_per_s: float | None
    fraction: float | None
    eta_s: float | None
    done: bool
    started: bool

    def plain(self) -> str:
        if not self.started:
            return f"{self.table}: waiting"
        parts = [f"{self.rows:,} rows"]
        if self.rows_per_s is not None:
            parts.append(f"{self.rows_per_s:,.0f} rows/s")
        if self.done:
            return f"{self.table}: done, {', '.join(parts)}"
        if self.fraction is not None:
            parts.append(f"{self.fraction:.0%}")
        if self.eta_s is not None:
            parts.append(f"ETA {clock_text(self.eta_s)}")
        return f"{self.table}: {', '.join(parts)}"

    def bar(self, name_width: int) -> str:
        name = str(self.table).ljust(name_width)
        if not self.started:
            return f"{name}  {' ' * (BAR_WIDTH + 2)}  waiting"
        fraction = 1.0 if self.done else self.fraction
        if fraction is None:
            bar, percent = "·" * BAR_WIDTH, "    "  # the table's size is not known
        else:
            filled = round(fraction * BAR_WIDTH)
            bar, percent = "█" * filled + "·" * (BAR_WIDTH - filled), f"{fraction:4.0%}"
        rate = "" if self.rows_per_s is None else f"{self.rows_per_s:>9,.0f} rows/s"
        if self.done:
            tail = "  done"
        elif self.eta_s is None:
            tail = ""  # no pace or no size yet: an estimate would be a guess
        else:
            tail = f"  ETA {clock_text(self.eta_s)}"
        return f"{name}  [{bar}] {percent}  {self.rows:>11,} rows {rate}{tail}".rstrip()


class DumpProgressView:
    """Shows a dump's progress on `stream`; `update` is the runner's `on_progress`."""

    def __init__(
        self,
        request: DumpRequest,
        progress: Mapping[TableRef, TableProgress],
        stream: TextIO,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = request
        self._stream = stream
        self._tty = stream.isatty() if tty is None else tty
        self._clock = clock
        self._progress = {t: progress.get(t) or TableProgress(t) for t in request.tables}
        self._paces: dict[TableRef, TablePace] = {}
        self._last_step = clock()
        self._drawn = 0
        if self._tty:
            self._draw()

    def update(self, dump_id: str, progress: TableProgress) -> None:
        now = self._clock()
        table = progress.table
        before = self._progress[table]
        if table not in self._paces:
            # Tables run one after another: this one began at the previous step.
            self._paces[table] = TablePace(self._last_step, before.rows_done)
        self._paces[table].step(progress, now)
        self._progress[table] = progress
        self._last_step = now
        if self._tty:
            self._draw()
        else:
            self._stream.write(f"  {self.line(table).plain()}\n")
            self._stream.flush()

    def line(self, table: TableRef) -> TableLine:
        progress, pace = self._progress[table], self._paces.get(table)
        started = progress.started or progress.done or pace is not None
        rate = None if pace is None else pace.rows_per_s()
        first = None if pace is None else pace.first
        fraction = estimated_fraction(progress, len(self._request.keys), first)
        eta = eta_s(progress, fraction, rate)
        return TableLine(table, progress.rows_done, rate, fraction, eta, progress.done, started)

    def _draw(self) -> None:
        width = max(len(str(t)) for t in self._request.tables)
        lines = [self.line(t).bar(width) for t in self._request.tables]
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self._stream.write(up + "".join(f"\x1b[2K  {line}\n" for line in lines))
        self._stream.flush()
        self._drawn = len(lines)
