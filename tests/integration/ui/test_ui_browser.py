"""`dblog ui` in headless Chromium during a dump on real PostgreSQL and Redis.

A tailer runs in this process and `dblog ui` as a subprocess; a dump runs in a thread whose
first high watermark waits until the page has shown its window open, so the page is seen to
show a window open and then closed without depending on timing. Through the page's buttons
the dump is paused, throttled and resumed (the store's controls change each time) and a
pending dump is cancelled; the page then shows every table at 100% and the dump done, and the
source's own updates counted per table. A filtered dump's card shows its filter beside its
table, as text whatever markup it holds. The last screenshot is kept (see `screenshots_dir`).
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import NdjsonOutput
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.browser import Page, chromium, screenshots_dir
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    cli_env,
    drop_databases,
    make_databases,
    wait_until,
    write_config,
)
from tests.integration.test_end_to_end import InProcessTailer

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
    """`dblog ui` on a free port; its URL. Stopped with SIGTERM, which must end it cleanly."""
    config = write_config(
        tmp_path / "dblog.toml", dbs, redis_server, {"type": "ndjson", "directory": "unused"}
    )
    port = free_port()
    log = (tmp_path / "ui.log").open("wb")
    process = subprocess.Popen(
        [DBLOG, "ui", "--config", str(config), "--port", str(port), "--interval", "0.2"],
        env=cli_env(dbs, redis_server),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert process.poll() is None, (tmp_path / "ui.log").read_text()
        try:
            return httpx.get(f"{url}/api/snapshot", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(serving, 30, "dblog ui serving")
        yield url
    finally:
        process.terminate()
        assert process.wait(30) == 0, (tmp_path / "ui.log").read_text()
        log.close()


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
                lambda: GatedChunks(dbs.source.chunk_source(), gate),
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
            page.type_into('.dump[data-dump-id="ui-dump"] input[name="delay_ms"]', "-1")
            click(page, "ui-dump", "throttle")
            refused = page.wait(
                f"{dump_card('ui-dump')}.querySelector('.message.bad')?.textContent",
                "a negative delay refused",
            )
            assert "delay_ms" in refused and _controls(store, "ui-dump").delay_ms == 15

            click(page, "ui-never", "cancel")
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


@contextmanager
def _screenshot_on_failure(page: Page, shots: Path) -> Iterator[None]:
    """What the page showed when a check failed, kept beside the other screenshots."""
    try:
        yield
    except BaseException:
        page.screenshot(shots / "failed.png")
        print(f"screenshots: {shots}")
        raise


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
