"""The live view's HTTP server: the page, its JSON snapshots (polled or streamed as
Server-Sent Events) and the dump controls, on the standard library's threaded server.

One sampler thread builds a snapshot every `interval_s`, and only while someone watches (a
stream is open, or a snapshot was asked for within the last few seconds), so an unwatched view
costs Redis nothing. Each viewer is sent the latest snapshot when it is ready for one: a viewer
that reads slowly skips the snapshots it missed instead of queueing them, and blocks only its
own thread. The tailer never waits on any of it.

The controls go through `DumpStore.pause/resume/cancel/throttle`, with the value checks of
`dblog throttle`; `rerun` resumes a failed or cancelled dump (`rerun.py`). A POST must be
JSON (a cross-site form cannot send that without a CORS preflight, which is never granted)
and the Host header must name this server, so a page elsewhere cannot drive a dump through a
browser on this machine.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.core.values import dump_id, finite_number, whole_number
from airflow_provider_dblog.state import DumpStore, StateStoreUnavailable, UnknownDump
from airflow_provider_dblog.ui.rerun import Rerunner
from airflow_provider_dblog.ui.snapshot import LiveView

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCHED_FOR_S = 5.0
"""After a snapshot request, the sampler keeps sampling this long without a stream open."""
KEEPALIVE_S = 15.0
SEND_TIMEOUT_S = 30.0
"""A viewer that takes longer than this to take one snapshot is dropped."""
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


class Snapshots(Protocol):
    """What the sampler samples: a `LiveView`."""

    def snapshot(self) -> dict[str, JsonValue]: ...


class Sampler(threading.Thread):
    """Samples `view` every `interval_s` while watched; the latest snapshot and its number."""

    def __init__(self, view: Snapshots, interval_s: float) -> None:
        super().__init__(name="dblog-ui-sampler", daemon=True)
        self._view = view
        self._interval_s = interval_s
        self._changed = threading.Condition()
        self._streams = 0
        self._asked_at = float("-inf")
        self._stopping = threading.Event()
        self.latest: tuple[int, bytes] = (0, b"")

    def watching(self, delta: int) -> None:
        """A stream opened (+1) or closed (-1)."""
        with self._changed:
            self._streams += delta
            self._changed.notify_all()

    def current(self) -> bytes | None:
        """A snapshot taken from now on (the sampler wakes if nobody watched), or the latest
        one if that takes too long; None if there is none at all yet."""
        with self._changed:
            self._asked_at = time.monotonic()
            self._changed.notify_all()
            number = self.latest[0]
            self._changed.wait_for(
                lambda: self.latest[0] > number, timeout=max(5.0, self._interval_s * 4)
            )
            return self.latest[1] or None

    def after(self, number: int, timeout_s: float) -> tuple[int, bytes] | None:
        """The latest snapshot once it is newer than `number`; None after `timeout_s`."""
        with self._changed:
            if self._changed.wait_for(lambda: self.latest[0] > number, timeout=timeout_s):
                return self.latest
            return None

    def _is_watched(self) -> bool:
        return self._streams > 0 or time.monotonic() - self._asked_at < WATCHED_FOR_S

    def run(self) -> None:
        while not self._stopping.is_set():
            with self._changed:
                self._changed.wait_for(lambda: self._is_watched() or self._stopping.is_set())
            if self._stopping.is_set():
                return
            started = time.monotonic()
            try:
                snapshot = self._view.snapshot()
            except Exception as exc:  # a bug must not freeze the page: it says so instead
                log.exception("the live view's snapshot failed")
                snapshot = {"error": f"the snapshot failed: {exc}"}
            body = json.dumps(snapshot, separators=(",", ":")).encode()
            with self._changed:
                self.latest = (self.latest[0] + 1, body)
                self._changed.notify_all()
            self._stopping.wait(max(0.0, self._interval_s - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()


class UiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], sampler: Sampler, view: LiveView, rerunner: Rerunner
    ) -> None:
        super().__init__(address, _Handler)
        self.host, self.port = address[0], self.server_address[1]
        self.sampler = sampler
        self.view = view
        self.dumps = view.store.dumps
        self.rerunner = rerunner


def control(
    dumps: DumpStore, rerunner: Rerunner, dump: str, action: str, body: dict[str, Any]
) -> tuple[int, str]:
    """Apply one control to a dump as `dblog pause|resume|cancel|throttle` does, or run a
    failed or cancelled one again as `dblog dump --resume` does: the HTTP status and the
    message to show."""
    try:
        dump = dump_id(dump)
        if action == "rerun":
            return rerunner.rerun(dumps, dump)
        if action == "throttle":
            changed = dumps.throttle(
                dump,
                chunk_size=_value(body, "chunk_size", whole_number(1)),
                delay_ms=_value(body, "delay_ms", whole_number(0)),
                max_rows_per_s=_value(body, "max_rows_per_s", finite_number(0)),
            )
        elif action in ("pause", "resume", "cancel"):
            changed = getattr(dumps, action)(dump)
        else:
            return HTTPStatus.NOT_FOUND, f"no control {action!r}"
    except InvalidRequest as exc:
        return HTTPStatus.BAD_REQUEST, str(exc)
    except UnknownDump as exc:
        return HTTPStatus.NOT_FOUND, str(exc)
    except StateStoreUnavailable as exc:
        return HTTPStatus.SERVICE_UNAVAILABLE, str(exc)
    if not changed:
        return HTTPStatus.CONFLICT, f"dump {dump} is finished"
    what = "throttle updated" if action == "throttle" else f"{action} requested"
    return HTTPStatus.OK, f"dump {dump}: {what}"


def _value(body: dict[str, Any], name: str, parse: Callable[[str], T]) -> T | None:
    """A setting from the request, checked as the command line checks it; None if left out."""
    raw = body.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse(str(raw).strip())
    except InvalidRequest as exc:
        raise InvalidRequest(f"{name}: {exc}") from None


class _Handler(BaseHTTPRequestHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in _STATIC:
            name, content_type = _STATIC[path]
            page = resources.files("airflow_provider_dblog.ui").joinpath("static", name)
            self._send(HTTPStatus.OK, page.read_bytes(), content_type)
        elif path == "/api/snapshot":
            body = self.server.sampler.current()
            if body is None:
                self._send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "no snapshot yet"})
            else:
                self._send(HTTPStatus.OK, body, "application/json")
        elif path == "/api/events":
            self._stream(parse_qs(urlsplit(self.path).query).get("dump", [None])[0])
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"nothing at {path}"})

    def do_POST(self) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._same_origin():
            self._send_json(HTTPStatus.FORBIDDEN, {"error": "not from this page"})
            return
        if len(parts) != 4 or parts[:2] != ["api", "dumps"]:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"nothing at {self.path}"})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": f"a JSON object, please: {exc}"})
            return
        server = self.server
        status, message = control(server.dumps, server.rerunner, parts[2], parts[3], body)
        key = "message" if status == HTTPStatus.OK else "error"
        self._send_json(status, {key: message})

    def _same_origin(self) -> bool:
        """JSON only, and the Host (and Origin, when sent) naming this server."""
        if self.headers.get_content_type() != "application/json":
            return False
        names = (self.server.host, "127.0.0.1", "localhost", "[::1]")
        allowed = {f"{name}:{self.server.port}" for name in names}
        if self.headers.get("Host") not in allowed:
            return False
        origin = self.headers.get("Origin")
        return origin is None or urlsplit(origin).netloc in allowed

    def _stream(self, dump: str | None) -> None:
        """Server-Sent Events: each new snapshot, skipping those a slow viewer missed; with
        `dump`, that dump listed in them however old (a page of it is open)."""
        if dump is not None:
            try:
                dump = dump_id(dump)
            except InvalidRequest as exc:
                self._send_json(HTTPStatus.BAD_REQUEST, {"error": f"dump: {exc}"})
                return
            self.server.view.pin(dump, +1)
        try:
            self._send_stream()
        finally:
            if dump is not None:
                self.server.view.pin(dump, -1)

    def _send_stream(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.connection.settimeout(SEND_TIMEOUT_S)
        sampler = self.server.sampler
        sampler.watching(+1)
        try:
            number = 0
            while True:
                latest = sampler.after(number, KEEPALIVE_S)
                if latest is None:
                    self.wfile.write(b": keepalive\n\n")
                else:
                    number, body = latest
                    self.wfile.write(b"data: " + body + b"\n\n")
                self.wfile.flush()
        except OSError:
            pass  # the viewer went away, or was too slow to take a snapshot
        finally:
            sampler.watching(-1)

    def _send_json(self, status: int, body: dict[str, JsonValue]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)


def serve(
    view: LiveView, address: str, port: int, interval_s: float, rerunner: Rerunner
) -> UiServer:
    """Start the sampler and the server (in a daemon thread); stop with `shutdown(server)`."""
    sampler = Sampler(view, interval_s)
    sampler.start()
    server = UiServer((address, port), sampler, view, rerunner)
    threading.Thread(target=server.serve_forever, name="dblog-ui", daemon=True).start()
    return server


def shutdown(server: UiServer) -> None:
    server.shutdown()
    server.server_close()
    server.sampler.stop()
