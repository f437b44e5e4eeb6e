"""`dblog ui` in headless Chromium during a dump on real PostgreSQL and Redis.

A tailer runs in this process and `dblog ui` as a subprocess; a dump runs in a thread whose
first high watermark waits until the page has shown its window open, so the page is seen to
show a window open and then closed without depending on timing. Through the page's buttons
the dump is paused, throttled and resumed (the store's controls change each time) and a
pending dump is cancelled (once confirmed); the page then shows every table at 100% and the
dump done, the source's own updates counted per table, and a window timeline whose bars and
labels do not cover one another. A filtered dump's card shows its filter beside its table, as
text whatever markup it holds. A tailer stopped is flagged long before its heartbeat expires,
and a dump started meanwhile warns that no tailer runs; that dump fails, and is resumed from
the page (after cancel asked for confirmation on another) to done, its measured pace and ETA
shown as it runs; a failed or cancelled dump offers that one way to resume and no other
control, a done one none. A dump task's link from Airflow opens that dump alone, which links back to
its DAG run; the list shows the most recent dumps, the rest behind "show more" and a count. A
verify run is listed with its counts, its differences marked.
The last screenshot is kept (see `screenshots_dir`).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.verify import ChunkVerdict, Difference
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import DumpFailed, run_dump
from airflow_provider_dblog.operators.request import dump_id_for
from airflow_provider_dblog.outputs import NdjsonOutput
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.browser import Page, chromium, screenshots_dir
from tests.integration.e2e_support import (
    Databases,
    cli_env,
    drop_databases,
    make_databases,
    wait_until,
    write_config,
)
from tests.integration.test_end_to_end import InProcessTailer
from tests.integration.ui_support import running_ui

pytestmark = pytest.mark.integration
ROWS = 200
CHUNK = 40
UPDATES = 7


class GatedChunks:
    """A chunk source whose first hw write waits until `gate` is set: until then the first
    window stays open (the tailer met its lw)."""

    def __init__(self, inner: ChunkSource, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate
        self._writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write_watermark(self, value: str) -> None:
        self._writes += 1
        if self._writes == 2:
            assert self._gate.wait(120), "the test never let the first hw through"
        self._inner.write_watermark(value)


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@pytest.fixture
def ui(dbs: Databases, redis_server: RedisInfo, tmp_path: Path) -> Iterator[str]:
    """`dblog ui` on a free port; its URL."""
    config = write_config(
        tmp_path / "dblog.toml", dbs, redis_server, {"type": "ndjson", "directory": "unused"}
    )
    with running_ui(config, cli_env(dbs, redis_server), tmp_path) as url:
        yield url


TIMELINE_CLASHES = """[...document.querySelectorAll('#timeline .bars')].flatMap(track => {
  const boxes = [...track.querySelectorAll('.bar')].map(b => [b, b.getBoundingClientRect()]);
  const clashes = boxes.filter(([b]) => b.scrollWidth > b.clientWidth + 1)
    .map(([b]) => 'label cut: ' + b.textContent);
  for (const [a, r] of boxes) for (const [b, q] of boxes)
    if (a !== b && r.left < q.left && q.left < r.right - 0.5 && r.top === q.top)
      clashes.push(a.textContent + ' over ' + b.textContent);
  return clashes;
})"""
"""JS: the timeline's bars that cover one another on one lane, or whose label is cut."""


def dump_card(dump_id: str) -> str:
    return f"document.querySelector('.dump[data-dump-id=\"{dump_id}\"]')"


def _count(table: str, op: str) -> str:
    """JS: the count the page shows for `table` and `op` (NaN while not shown)."""
    return (
        f"Number(document.querySelector('.row[data-table=\"{table}\"] [data-op={op}]')"
        "?.dataset.count)"
    )


def click(page: Page, dump_id: str, action: str) -> None:
    page.click(f'.dump[data-dump-id="{dump_id}"] button[data-action="{action}"]')


def test_live_view_follows_a_dump_and_drives_its_controls(
    dbs: Databases, redis_server: RedisInfo, ui: str, tmp_path: Path
) -> None:
    store = StateStore(redis_server.client(), dbs.config.name)
    tailer = InProcessTailer(dbs, store, NdjsonOutput(tmp_path / "events"))
    gate = threading.Event()
    store.dumps.create(DumpRequest("ui-dump", DumpKind.ALL, TABLES, chunk_size=CHUNK))
    store.dumps.create(DumpRequest("ui-never", DumpKind.ALL, TABLES[:1], chunk_size=CHUNK))
    outcome: list[DumpState] = []
    dump = threading.Thread(
        target=lambda: outcome.append(
            run_dump(
                store,
                lambda read_only=False: GatedChunks(dbs.source.chunk_source(), gate),
                "ui-dump",
                window_timeout_s=120,
            )
        ),
        daemon=True,
    )
    shots = screenshots_dir("ui-browser-")
    try:
        with chromium(tmp_path) as page, _screenshot_on_failure(page, shots):
            page.navigate(ui)
            page.wait("document.querySelector('#live').dataset.live === 'live'", "the stream")
            dump.start()

            # The first window, held open by its hw, as the page shows it.
            window_id = page.wait(
                "document.querySelector('tr.window[data-state=open]')?.dataset.windowId",
                "a window shown open",
            )
            page.screenshot(shots / "window-open.png")
            with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
                for key in range(1, UPDATES + 1):
                    conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (key,))

            click(page, "ui-dump", "pause")
            wait_until(lambda: _controls(store, "ui-dump").paused, 30, "pause in the store")
            gate.set()
            page.wait(
                f"document.querySelector('tr.window[data-window-id=\"{window_id}\"]')"
                "?.dataset.state === 'closed'",
                "the held window shown closed",
            )
            seen = page.evaluate(
                f"document.querySelector('tr.window[data-window-id=\"{window_id}\"]').dataset.seen"
            )
            assert "open" in seen.split() and seen.split()[-1] == "closed", seen
            page.wait(f"{dump_card('ui-dump')}.dataset.state === 'paused'", "the dump paused")

            page.type_into('.dump[data-dump-id="ui-dump"] input[name="delay_ms"]', "15")
            click(page, "ui-dump", "throttle")
            wait_until(lambda: _controls(store, "ui-dump").delay_ms == 15, 30, "the throttle")
            page.wait(
                f"{dump_card('ui-dump')}.querySelector('.controls .message:not(.bad)')?.textContent"
                " === 'dump ui-dump: throttle updated'",
                "the throttle's answer shown",
            )
            page.type_into('.dump[data-dump-id="ui-dump"] input[name="delay_ms"]', "-1")
            click(page, "ui-dump", "throttle")
            refused = page.wait(
                f"{dump_card('ui-dump')}.querySelector('.message.bad')?.textContent",
                "a negative delay refused",
            )
            assert "delay_ms" in refused and _controls(store, "ui-dump").delay_ms == 15

            click(page, "ui-never", "cancel")
            click(page, "ui-never", "confirm-cancel")
            page.wait(f"{dump_card('ui-never')}.dataset.state === 'cancelled'", "cancelled")
            assert _status(store, "ui-never") is DumpState.CANCELLED

            click(page, "ui-dump", "resume")
            wait_until(lambda: not _controls(store, "ui-dump").paused, 30, "resume in the store")
            percents = page.wait(
                f"{dump_card('ui-dump')}.dataset.state === 'done' && "
                f"[...{dump_card('ui-dump')}.querySelectorAll('.progress')]"
                ".map(p => p.dataset.table + ' ' + p.dataset.percent)",
                "the dump shown done",
                timeout_s=120,
            )
            assert sorted(percents) == sorted(f"{t} 100" for t in TABLES)
            assert page.evaluate(shown_buttons("ui-dump")) == []  # done: nothing to press
            closed = page.evaluate(
                "document.querySelectorAll('tr.window[data-state=closed]').length"
            )
            assert closed == _chunks(store, "ui-dump")
            # The updates in the first window were the table's first changes this session: its
            # first schema event ends no window, so no chunk was read twice.
            assert store.dumps.status("ui-dump").windows_retried == 0
            # The updates came inside the first window, on keys of its chunk: those chunk
            # rows were dropped by collision, the rest of the table emitted at hw.
            counts = page.wait(
                f"{_count('public.accounts', 'r')} === {ROWS - UPDATES} && Object.fromEntries("
                "[...document.querySelectorAll('.row[data-table=\"public.accounts\"] [data-op]')]"
                ".map(s => [s.dataset.op, Number(s.dataset.count)]))",
                "the dump's rows counted in the page",
            )
            assert counts == {
                "c": 0,
                "u": UPDATES,
                "d": 0,
                "r": ROWS - UPDATES,
                "dropped": UPDATES,
            }
            page.screenshot(shots / "dump-done.png")
            assert page.evaluate(TIMELINE_CLASHES) == []
        dump.join(30)
        assert outcome == [DumpState.DONE]
        print(f"screenshots: {shots}")
        assert (shots / "dump-done.png").stat().st_size > 10_000
    finally:
        gate.set()
        tailer.stop()


def test_controls_refuse_what_the_command_line_refuses(
    dbs: Databases, redis_server: RedisInfo, ui: str
) -> None:
    """The page's API: a bad value, an unknown or finished dump, a request that is not JSON
    or names another host; none changes the store. A dump id arrives escaped, as the page
    sends it (`:` as `%3A`)."""
    store = StateStore(redis_server.client(), dbs.config.name)
    store.dumps.create(DumpRequest("api:dump", DumpKind.ALL, TABLES, chunk_size=CHUNK))
    post = lambda path, body, **headers: httpx.post(  # noqa: E731
        f"{ui}/api/dumps/{path}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json", **headers},
    )
    answer = post("api%3Adump/throttle", {"chunk_size": "0"})
    assert answer.status_code == 400 and "chunk_size" in answer.json()["error"]
    answer = post("api%3Adump/throttle", {})
    assert answer.status_code == 400 and "at least one setting" in answer.json()["error"]
    assert post("no-such-dump/pause", {}).status_code == 404
    assert post("bad id!/pause", {}).status_code == 400
    assert post("api%3Adump/explode", {}).status_code == 404
    assert post("api%3Adump/pause", {}, Origin="http://elsewhere.example").status_code == 403
    assert post("api%3Adump/pause", {}, Host="elsewhere.example").status_code == 403
    form = httpx.post(f"{ui}/api/dumps/api:dump/pause", content=b"{}")
    assert form.status_code == 403
    assert not _controls(store, "api:dump").paused
    answer = post("api%3Adump/throttle", {"chunk_size": 7, "max_rows_per_s": "2.5"})
    assert answer.status_code == 200, answer.text
    controls = _controls(store, "api:dump")
    assert (controls.chunk_size, controls.max_rows_per_s) == (7, 2.5)
    assert post("api%3Adump/cancel", {}).status_code == 200
    assert post("api%3Adump/resume", {}).status_code == 409
    snapshot = httpx.get(f"{ui}/api/snapshot").json()
    assert [d["state"] for d in snapshot["dumps"]] == ["cancelled"]


HOSTILE_FILTER = """owner <> '<img src=x onerror="document.title=42">' AND id < 50"""
"""A filter a source takes (checked below) that is also markup: the page must show it as text."""


def test_a_filtered_dump_shows_its_filter_as_text_beside_its_table(
    dbs: Databases, redis_server: RedisInfo, ui: str, tmp_path: Path
) -> None:
    store = StateStore(redis_server.client(), dbs.config.name)
    accounts = dbs.table("accounts")
    chunks = dbs.source.chunk_source()
    try:
        where = chunks.check_filter(accounts, HOSTILE_FILTER)
    finally:
        chunks.close()
    store.dumps.create(
        DumpRequest("ui-filtered", DumpKind.TABLE, (accounts,), chunk_size=CHUNK, where=where)
    )
    store.dumps.create(DumpRequest("ui-whole", DumpKind.TABLE, (accounts,), chunk_size=CHUNK))
    assert [d["where"] for d in httpx.get(f"{ui}/api/snapshot").json()["dumps"]] == [None, where]
    shots = screenshots_dir("ui-filter-")
    with chromium(tmp_path) as page, _screenshot_on_failure(page, shots):
        page.navigate(ui)
        card = dump_card("ui-filtered")
        shown = page.wait(f"{card}?.querySelector('.filter code')?.textContent", "the filter")
        assert shown == where
        assert page.evaluate(f"{card}.querySelector('.filter').innerText") == f"where {where}"
        # Beside its table: the filter's line comes right before the table's progress.
        assert page.evaluate(
            f"{card}.querySelector('.filter').nextElementSibling.querySelector('.progress')"
            ".dataset.table"
        ) == str(accounts)
        assert page.evaluate("document.querySelectorAll('.dump img').length") == 0
        assert page.evaluate("document.title") != "42"
        assert page.evaluate(f"{dump_card('ui-whole')}.querySelector('.filter').hidden") is True
        page.screenshot(shots / "filtered-dump.png")
    print(f"screenshots: {shots}")


def test_a_stopped_tailer_is_flagged_and_a_failed_dump_resumed_from_the_page(
    dbs: Databases, redis_server: RedisInfo, ui: str, tmp_path: Path
) -> None:
    store = StateStore(redis_server.client(), dbs.config.name)
    accounts = dbs.table("accounts")
    tailer = InProcessTailer(dbs, store, NdjsonOutput(tmp_path / "events"))
    shots = screenshots_dir("ui-resume-")
    orphan: list[DumpFailed] = []
    with chromium(tmp_path) as page, _screenshot_on_failure(page, shots):
        page.navigate(ui)
        page.wait("document.querySelector('#tailer').dataset.alive === 'yes'", "tailer alive")
        tailer.stop()
        flagged = page.wait(
            "document.querySelector('#tailer').dataset.alive === 'no' && "
            "document.querySelector('#tailer').innerText",
            "the stopped tailer flagged",
        )
        # Flagged from its missed beats: the heartbeat itself has not expired yet.
        assert "stopped?" in flagged and "no heartbeat for" in flagged, flagged
        assert store.tailer.health() is not None

        # A dump started with no tailer: its card warns; its window never closes, it fails.
        store.dumps.create(DumpRequest("ui-orphan", DumpKind.TABLE, (accounts,), chunk_size=CHUNK))

        def run_orphan() -> None:
            try:
                run_dump(
                    store, dbs.source.chunk_source, "ui-orphan", window_timeout_s=10, max_attempts=1
                )
            except DumpFailed as exc:
                orphan.append(exc)

        dump = threading.Thread(target=run_orphan, daemon=True)
        dump.start()
        card = dump_card("ui-orphan")
        warning = page.wait(
            f"{card}?.dataset.state === 'running' && !{card}.querySelector('.warning').hidden "
            f"&& {card}.querySelector('.warning').textContent",
            "the running dump warned that no tailer runs",
        )
        assert "no tailer is running" in warning
        page.screenshot(shots / "no-tailer.png")
        figures = page.wait(
            f"{card}.dataset.state === 'failed' && "
            f"{card}.querySelector('.progress .figures').textContent",
            "the dump shown failed",
        )
        dump.join(30)
        assert len(orphan) == 1 and "Is the tailer running" in str(orphan[0])
        assert _status(store, "ui-orphan") is DumpState.FAILED
        assert "waiting" not in figures and "stopped (failed)" in figures, figures
        assert page.evaluate(f"{card}.querySelector('.rerun code').textContent") == (
            "dblog dump --dump-id ui-orphan --resume"
        )
        assert page.evaluate(f"{card}.querySelector('.warning').hidden") is True

        # Cancel asks first: "no" keeps the dump, "yes" cancels it.
        store.dumps.create(DumpRequest("ui-cancel", DumpKind.TABLE, (accounts,), chunk_size=CHUNK))
        click(page, "ui-cancel", "cancel")
        page.wait(f"!{dump_card('ui-cancel')}.querySelector('.confirm').hidden", "the question")
        click(page, "ui-cancel", "keep")
        assert page.evaluate(f"{dump_card('ui-cancel')}.querySelector('.confirm').hidden")
        assert not _controls(store, "ui-cancel").cancelled
        click(page, "ui-cancel", "cancel")
        click(page, "ui-cancel", "confirm-cancel")
        page.wait(f"{dump_card('ui-cancel')}.dataset.state === 'cancelled'", "cancelled")
        assert page.evaluate(f"{dump_card('ui-cancel')}.querySelector('.rerun').hidden") is False
        # One way to resume it, and no control a finished dump cannot take.
        for stopped in ("ui-cancel", "ui-orphan"):
            assert page.evaluate(shown_buttons(stopped)) == ["resume from its last chunk"]
        figures = page.evaluate(f"{dump_card('ui-cancel')}.querySelector('.figures').textContent")
        assert "not started" in figures and "waiting" not in figures, figures

        # A tailer again, and the failed dump resumed from the page, slowed down so that its
        # pace and ETA are seen while it runs: small chunks with a delay between them, for it
        # may have read a few before the throttle lands.
        tailer = InProcessTailer(dbs, store, NdjsonOutput(tmp_path / "events"))
        try:
            page.wait("document.querySelector('#tailer').dataset.alive === 'yes'", "a tailer")
            click(page, "ui-orphan", "rerun")
            # A finished dump takes no throttle: it does once the run started has reopened it.
            wait_until(
                lambda: store.dumps.throttle("ui-orphan", chunk_size=10, delay_ms=700),
                60,
                "the dump reopened",
            )
            pace = page.wait(
                f"{card}.dataset.state === 'running' && "
                f"{card}.querySelector('.progress .figures').textContent.includes('ETA') && "
                f"{card}.querySelector('.pace').textContent",
                "the resumed dump's pace and ETA",
            )
            assert "rows/s" in pace and "on average" not in pace, pace
            page.screenshot(shots / "resumed.png")
            page.wait(f"{card}.dataset.state === 'done'", "the resumed dump done", timeout_s=120)
            status = store.dumps.status("ui-orphan")
            assert status is not None and status.rows == ROWS
            assert "on average" in page.evaluate(f"{card}.querySelector('.pace').textContent")
            assert "took" in page.evaluate(f"{card}.querySelector('.times').textContent")
        finally:
            tailer.stop()
    print(f"screenshots: {shots}")


def test_an_airflow_link_opens_its_dump_which_links_back_and_the_list_is_bounded(
    dbs: Databases,
    redis_server: RedisInfo,
    ui: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link of a finished dump task, as `DBLogLiveViewLink.get_link` gives it for the
    connection's `ui_url`, opens that dump's page, though 24 dumps came after it; the list of
    all dumps shows 5 of them, then the 20 listed, and counts the rest."""
    from airflow.sdk.types import TaskInstanceKey

    from airflow_provider_dblog.operators.dblog import DBLogDumpOperator
    from airflow_provider_dblog.operators.links import DBLogLiveViewLink, airflow_origin

    store = StateStore(redis_server.client(), dbs.config.name)
    accounts = dbs.table("accounts")
    key = TaskInstanceKey("dblog_repair", "dump", "manual__2026-11-27T10:00:00+00:00", 1, -1)
    dump_id = dump_id_for(key.dag_id, key.run_id, key.task_id)
    store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (accounts,), chunk_size=CHUNK))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")
    origin = airflow_origin(key)
    store.dumps.record_origin(dump_id, origin)
    store.dumps.mark(dump_id, DumpState.RUNNING)
    store.dumps.mark(dump_id, DumpState.DONE)
    for n in range(24):
        store.dumps.create(DumpRequest(f"later-{n:02}", DumpKind.TABLE, (accounts,)))
    conn = {"conn_type": "dblog", "extra": {"source_name": dbs.config.name, "ui_url": ui}}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_LINKED", json.dumps(conn))
    operator = DBLogDumpOperator(task_id=key.task_id, dblog_conn_id="dblog_linked")
    link = DBLogLiveViewLink().get_link(operator, ti_key=key)
    assert link == f"{ui}/#dump={dump_id}"
    store.verifies.create("v-page", {"tables": [str(accounts)], "chunk_size": CHUNK})
    verdict = ChunkVerdict(39, 1, (((7,), Difference.CHANGED),))
    store.verifies.chunk_done("v-page", accounts, {"after": [40]}, verdict)

    shots = screenshots_dir("ui-link-")
    with chromium(tmp_path) as page, _screenshot_on_failure(page, shots):
        page.navigate(link)
        card = dump_card(dump_id)
        back = page.wait(f"{card}?.querySelector('.origin a')?.href", "the dump's page")
        assert (
            back
            == origin["run_url"]
            == (
                "http://airflow.example:8080/dags/dblog_repair/runs/"
                "manual__2026-11-27T10%3A00%3A00%2B00%3A00"
            )
        )
        assert page.evaluate("document.querySelectorAll('.dump').length") == 1
        assert page.evaluate(f"{card}.dataset.state") == "done"
        row = "document.querySelector('#verifies tr[data-verify=\"v-page\"]')"
        changed = page.wait(
            f"{row}?.querySelector('[data-count=changed]')?.textContent", "the verify run"
        )
        assert changed == "1" and page.evaluate(f"{row}.className") == "verify running differs"
        page.screenshot(shots / "linked-dump.png")

        page.click("#dumps-note a.all")
        page.wait("document.querySelectorAll('.dump').length === 5", "the 5 most recent")
        note = page.evaluate("document.querySelector('#dumps-note').innerText")
        assert "show 15 more" in note and "5 older dumps not listed" in note, note
        assert page.evaluate("document.querySelector('.dump').dataset.dumpId") == "later-23"
        page.click("#dumps-note button.more")
        page.wait("document.querySelectorAll('.dump').length === 20", "the 20 listed")
        assert page.evaluate(f"!!{card}") is False  # the oldest, beyond the 20 listed
        page.navigate(f"{ui}/#dump=no-such-dump")
        page.wait(
            "document.querySelector('#dumps').innerText === 'no dump no-such-dump in this source'",
            "no such dump",
        )
    print(f"screenshots: {shots}")


@contextmanager
def _screenshot_on_failure(page: Page, shots: Path) -> Iterator[None]:
    """What the page showed when a check failed, kept beside the other screenshots."""
    try:
        yield
    except BaseException:
        page.screenshot(shots / "failed.png")
        print(f"screenshots: {shots}")
        raise


def shown_buttons(dump_id: str) -> str:
    """A script: the labels of the buttons a person sees on a dump's card."""
    return (
        f"[...{dump_card(dump_id)}.querySelectorAll('button')]"
        ".filter((b) => b.checkVisibility()).map((b) => b.textContent)"
    )


def _controls(store: StateStore, dump_id: str) -> Any:
    controls = store.dumps.controls(dump_id)
    assert controls is not None
    return controls


def _status(store: StateStore, dump_id: str) -> DumpState:
    status = store.dumps.status(dump_id)
    assert status is not None
    return status.state


def _chunks(store: StateStore, dump_id: str) -> int:
    status = store.dumps.status(dump_id)
    assert status is not None
    return status.chunks
