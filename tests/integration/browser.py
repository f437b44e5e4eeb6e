"""A headless Chromium for the tests, driven through its DevTools protocol.

The browser is Debian's `chromium` (scripts/install-system-deps.sh), started with its own
profile in a temp dir and a free DevTools port; nothing downloads a browser. `Page` speaks
the protocol over one WebSocket (the `websockets` package): navigate, run JavaScript, type
as a keyboard does (so React sees the input events), click, and take screenshots.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from airflow_provider_dblog.devservices.process import free_port
from tests.integration.airflow_server import wait_for

CHROMIUM = "chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--window-size=1400,1000",
)
PATIENCE_S = 120
"""How long a page may take to show what is waited for: generous, as a loaded machine (a
Spark dump, Airflow's components and the browser on two cores) answers slowly, and a wait
ends as soon as its condition holds."""


def screenshots_dir(prefix: str) -> Path:
    """A new directory under $DBLOG_TEST_ARTIFACTS (default: the temp dir's
    `dblog-test-artifacts`), kept after the test: pytest's own temp dirs are pruned when
    other sessions start."""
    default = Path(tempfile.gettempdir()) / "dblog-test-artifacts"
    base = Path(os.environ.get("DBLOG_TEST_ARTIFACTS") or default)
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class Page:
    """One browser tab."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method and return its result (events meanwhile are dropped)."""
        call_id = next(self._ids)
        self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, script: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        answer = self.send(
            "Runtime.evaluate", expression=script, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in answer:
            raise AssertionError(f"{script}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'", f"{url} loaded")

    def wait(self, condition: str, what: str, timeout_s: float = PATIENCE_S) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        return wait_for(lambda: self.evaluate(condition), timeout_s, what, every_s=0.25)

    def click(self, selector: str) -> None:
        self.wait(f"!!document.querySelector({json.dumps(selector)})", f"{selector} shown")
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def click_text(self, tag: str, text: str) -> None:
        """Click the first `tag` element whose text is `text` (a button, a tab)."""
        find = (
            f"[...document.querySelectorAll({json.dumps(tag)})]"
            f".find(e => e.textContent.trim() === {json.dumps(text)})"
        )
        self.wait(f"!!{find}", f"{tag} {text!r} shown")
        self.evaluate(f"{find}.click()")

    def type_into(self, selector: str, text: str) -> None:
        """Replace the text of an input or textarea as a person would: focus, select all,
        type (the page sees real input events)."""
        self.wait(f"!!document.querySelector({json.dumps(selector)})", f"{selector} shown")
        self.evaluate(
            f"(e => {{ e.focus(); e.select(); }})(document.querySelector({json.dumps(selector)}))"
        )
        self.send("Input.insertText", text=text)

    def text(self) -> str:
        text: str = self.evaluate("document.body.innerText")
        return text

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path


@contextmanager
def chromium(work: Path) -> Iterator[Page]:
    """A headless Chromium with a profile under `work`, and a blank tab; stopped at exit."""
    binary = shutil.which(CHROMIUM)
    assert binary, "chromium is not installed: run scripts/install-system-deps.sh as root"
    port = free_port()
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=work))
    process = subprocess.Popen(
        [binary, *FLAGS, f"--remote-debugging-port={port}", f"--user-data-dir={profile}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(work / "chromium.log").open("ab"),
        start_new_session=True,
    )
    try:
        devtools = f"http://127.0.0.1:{port}"

        def tab() -> dict[str, Any] | None:
            assert process.poll() is None, (work / "chromium.log").read_text()[-2000:]
            with suppress(httpx.TransportError):
                pages = httpx.get(f"{devtools}/json/list", timeout=5).json()
                return next((p for p in pages if p.get("type") == "page"), None)
            return None

        target = wait_for(tab, 30, "chromium's DevTools endpoint")
        # No keepalive: the test may leave the socket idle for minutes while a run goes on,
        # and no DevTools domain is enabled, so no events pile up meanwhile.
        with connect(target["webSocketDebuggerUrl"], max_size=None, ping_interval=None) as socket:
            yield Page(socket)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(profile, ignore_errors=True)
