"""`dblog dump`'s progress display, fed the runner's progress by hand on a fake clock: the pace,
the share done and the ETA it derives, on a terminal and in plain lines."""

from __future__ import annotations

import io
import re

from airflow_provider_dblog.cli.progress import DumpProgressView
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.event import TableRef

ACCOUNTS, ORDERS = TableRef("public", "accounts"), TableRef("public", "orders")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _range_step(table: TableRef, after: int, rows: int, *, done: bool = False) -> TableProgress:
    """A full-table dump of keys 1..1000, one row per key."""
    return TableProgress(
        table, started=True, done=done, max_key=(1000,), after=(after,), rows_done=rows
    )


def test_plain_lines_give_rows_pace_share_and_eta_of_an_integer_keyed_table() -> None:
    request = DumpRequest("d1", DumpKind.ALL, (ACCOUNTS, ORDERS))
    out, clock = io.StringIO(), Clock()
    view = DumpProgressView(request, {}, out, clock=clock)
    assert out.getvalue() == ""  # not a terminal: nothing drawn ahead of the first step
    clock.now += 2
    view.update("d1", _range_step(ACCOUNTS, 100, 100))
    clock.now += 2
    view.update("d1", _range_step(ACCOUNTS, 300, 300))
    clock.now += 7
    view.update("d1", _range_step(ACCOUNTS, 1000, 1000, done=True))
    first, second, third = out.getvalue().splitlines()
    # One step seen: the pace is known, the rows per key not yet.
    assert first == "  public.accounts: 100 rows, 50 rows/s"
    # 300 of about 1000 rows in 4 s: 75 rows/s, 700 rows left.
    assert second == "  public.accounts: 300 rows, 75 rows/s, 30%, ETA 0:09"
    assert third == "  public.accounts: done, 1,000 rows, 91 rows/s"


def test_a_keys_dump_knows_its_total_whatever_the_key_type() -> None:
    keys = tuple(("eu", n) for n in range(10))
    request = DumpRequest("d2", DumpKind.KEYS, (ORDERS,), keys=keys)
    out, clock = io.StringIO(), Clock()
    view = DumpProgressView(request, {}, out, clock=clock)
    clock.now += 4
    view.update("d2", TableProgress(ORDERS, started=True, key_index=4, rows_done=4))
    assert out.getvalue() == "  public.orders: 4 rows, 1 rows/s, 40%, ETA 0:06\n"


def test_a_resumed_dump_counts_only_this_run_s_rows_in_its_pace() -> None:
    request = DumpRequest("d3", DumpKind.ALL, (ACCOUNTS,))
    resumed = {ACCOUNTS: _range_step(ACCOUNTS, 500, 500)}
    out, clock = io.StringIO(), Clock()
    view = DumpProgressView(request, resumed, out, clock=clock)
    clock.now += 10
    view.update("d3", _range_step(ACCOUNTS, 600, 600))
    assert out.getvalue() == "  public.accounts: 600 rows, 10 rows/s\n"


def test_a_terminal_redraws_one_bar_per_table_in_place() -> None:
    request = DumpRequest("d4", DumpKind.ALL, (ACCOUNTS, ORDERS))
    out, clock = io.StringIO(), Clock()
    view = DumpProgressView(request, {}, out, clock=clock, tty=True)
    clock.now += 1
    view.update("d4", _range_step(ACCOUNTS, 250, 250))
    clock.now += 1
    view.update("d4", _range_step(ACCOUNTS, 500, 500))
    frames = out.getvalue().split("\x1b[2F")
    assert len(frames) == 3  # drawn at start, then redrawn over itself twice
    assert all(frame.count("\x1b[2K") == 2 for frame in frames)
    last = [re.sub(r"\s+", " ", line) for line in frames[-1].split("\x1b[2K") if line]
    assert last[0].strip() == (
        "public.accounts [" + "█" * 12 + "·" * 12 + "] 50% 500 rows 250 rows/s ETA 0:02"
    )
    assert last[1].strip() == "public.orders waiting"


def test_a_bar_without_a_size_or_pace_shows_no_guess() -> None:
    request = DumpRequest("d5", DumpKind.ALL, (ACCOUNTS,))
    out, clock = io.StringIO(), Clock()
    view = DumpProgressView(request, {}, out, clock=clock, tty=True)
    sizeless = TableProgress(ACCOUNTS, started=True, after=("m",), rows_done=40)
    view.update("d5", sizeless)
    last = out.getvalue().split("\x1b[2K")[-1]
    assert re.sub(r"\s+", " ", last).strip() == "public.accounts [" + "·" * 24 + "] 40 rows"
    assert "?" not in out.getvalue() and "ETA" not in out.getvalue()
