"""Rotating NDJSON files: one encoded event per line, `events-000001.ndjson`, `events-000002...`.

Table-level events are lines like any other, in position order: `"op": "t"` (the table was
truncated) and `"op": "s"` (its columns changed, the new ones in `table_schema`), both with
`"key": {}` and null `before` and `after` (see `core/event.py`, and the consumer rules in
docs/operations.md).

A batch is written whole and then fsynced, so after a crash only the last line of the last file
can be torn, and a line is complete only with its `\\n`. A writer's first batch cuts such a torn
line off, and `read_events` never returns one. A new file's directory entry is fsynced before
any event in it counts as durable.

Replays are dropped here: positions strictly increase in output order, so an event whose position
is not greater than the last one in the files was written before a tailer restart.

Several writers (tailers of one source on different hosts sharing the directory) take turns by
lease token; `.fence` holds the largest token that took the directory over. A writer takes it
over at its first batch (and after an error), under an exclusive lock on `.lock`: it refuses a
token smaller than the fence, records its own, seals the last file and reads the files again
(the last position, the current file). Sealing puts a copy of the last file under its name and
unlinks the file itself. An earlier writer stopped in the middle of a batch (SIGSTOP, a paused
VM) still has that file open: when it wakes, its lines go to a file nobody reads, and it cannot
start a file either, because a writer starts one only under the lock and only while its own
file is still the one named. So none of its lines can follow the new writer's, and the new
writer does not wait for it: a standby that got the lease takes over at its first batch.

Batches take no lock. After each fsync a writer checks that its file is still the one named
(a stat and an fstat): if a newer writer sealed it, the batch raises `OutputFenced`, so `write`
returning still means its lines are in the files. The seal copies the bulk while the file is in
view, then renames the file to a hidden name and copies what was appended since, the torn last
line left out: a reader never sees a line go away, it only misses the last file for that
moment (a crash then leaves it hidden; the next takeover puts it back). The bound: the lock is
held only while a writer takes the directory over (a copy of the last file and a few fsyncs) or
starts a file, never across a batch's writes; a writer frozen inside one of those keeps the
others out until it wakes: they wait `lock_timeout_s`, then report the output unavailable
(retry later).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from pathlib import Path
from typing import cast

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.event_codec import decode, encode_lines
from airflow_provider_dblog.core.lines import Lines
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputFenced,
    OutputUnavailable,
    drop_replayed,
)

log = logging.getLogger(__name__)

FILE_PATTERN = re.compile(r"events-(\d{6,})\.ndjson")
LOCK_FILE = ".lock"
FENCE_FILE = ".fence"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_LOCK_TIMEOUT_S = 5.0
_LOCK_POLL_S = 0.02
_BLOCK = 64 * 1024
_HIDDEN = ".sealed"


def file_name(number: int) -> str:
    return f"events-{number:06d}.ndjson"


def _numbered_files(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = FILE_PATTERN.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def event_files(directory: Path | str) -> list[Path]:
    """The event files of `directory` in write order (by number, not by name)."""
    return [path for _, path in _numbered_files(Path(directory))]


def read_events(directory: Path | str) -> Iterator[Event]:
    """Every complete event in write order. A last line without its newline is being written
    (or was torn by a crash) and is not returned; a torn line anywhere else is an error."""
    files = event_files(directory)
    for index, path in enumerate(files):
        with path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.endswith(b"\n"):
                    if index == len(files) - 1:
                        return
                    raise ValueError(f"{path}:{number}: torn line in a file that is not the last")
                yield decode(line)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_line(fd: int, size: int) -> tuple[int, bytes | None]:
    """The offset just after the last complete line, and that line (None if there is none).
    Reads backwards, so opening a large file costs a few blocks, not the whole file."""
    start, buf = size, b""
    while start > 0:
        step = min(_BLOCK, start)
        start -= step
        buf = os.pread(fd, step, start) + buf
        newline = buf.rfind(b"\n")
        if newline < 0:
            continue
        previous = buf.rfind(b"\n", 0, newline)
        if previous >= 0 or start == 0:
            return start + newline + 1, buf[previous + 1 : newline]
    return 0, None


def _copy(source: int, target: int, offset: int) -> int:
    """Append `source` from `offset` to its end onto `target`, in the kernel; the end."""
    while sent := os.sendfile(target, source, offset, 1 << 30):
        offset += sent
    return offset


class NdjsonOutput(Output):
    """Appends events to numbered files in `directory`, starting a new file before one would
    grow past `max_bytes` (a single larger event still gets a file of its own). Writers take
    turns by lease token (see the module docstring); one waits at most `lock_timeout_s` for
    another to finish taking the directory over or starting a file."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    ) -> None:
        if max_bytes <= 0:
            raise OutputError(f"ndjson max_bytes must be positive, got {max_bytes}")
        if lock_timeout_s <= 0:
            raise OutputError(f"ndjson lock_timeout_s must be positive, got {lock_timeout_s}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.lock_timeout_s = lock_timeout_s
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_position: Position | None = None
        """The position of the last event in the files: later writes skip anything not newer."""
        self._fd = -1
        self._number = 0
        self._size = 0
        self._token: int | None = None
        """The token this object took the directory over with: its view of the files is
        current while its file is still the one named (no newer writer sealed it)."""
        self._lock = os.open(self.directory / LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o644)

    @property
    def current_file(self) -> Path:
        return self.directory / file_name(self._number)

    @property
    def fence_file(self) -> Path:
        return self.directory / FENCE_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the directory's lock, waiting at most `lock_timeout_s` for another writer."""
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise OutputUnavailable(
                        f"{self.directory / LOCK_FILE}: lock held by another writer for "
                        f"{self.lock_timeout_s:g}s (one stopped while it took the directory "
                        "over or started a file?)"
                    ) from None
                time.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _unavailable(self, path: Path) -> Iterator[None]:
        """A failing disk (EIO, ENOSPC, ...) as `OutputUnavailable` naming the file; the next
        batch takes the directory over again."""
        try:
            yield
        except OSError as exc:
            self._token = None
            raise OutputUnavailable(f"ndjson output: cannot write {path}: {exc}") from exc

    def _take(self, token: int) -> None:
        """Refuse a stale `token`; otherwise record it as the fence, seal the last file and
        read the files again, all under the lock."""
        self._token = None
        with self._locked(), self._unavailable(self.directory):
            fence = self._read_fence()
            if fence is not None and fence > token:
                raise OutputFenced(f"ndjson output {self.directory}", token, fence)
            if fence != token:
                self._write_fence(token)
            self._put_back_hidden()
            self._seal()
            self._find_last_position()
        if fence is not None and fence != token:
            log.info("took %s over from lease token %d (now %d)", self.directory, fence, token)
        self._token = token

    def _put_back_hidden(self) -> None:
        """Undo a seal a crash cut short: the hidden file goes back under its name unless its
        copy is there already."""
        for path in self.directory.glob(f".events-*.ndjson{_HIDDEN}"):
            named = self.directory / path.name[1 : -len(_HIDDEN)]
            if named.exists():
                path.unlink()
            else:
                log.warning("putting %s back, hidden by a takeover that did not end", named)
                os.rename(path, named)

    def _seal(self) -> None:
        """Make the last file the current one, as a copy of itself: an earlier writer that
        still holds the file writes into one nobody reads any more."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        files = _numbered_files(self.directory)
        if not files:
            self._number = 0
            self._next_file()
            _fsync_dir(self.directory)
            return
        self._number, path = files[-1]
        hidden = self.directory / f".{path.name}{_HIDDEN}"
        copy = self.directory / f".{path.name}.copy"
        source = os.open(path, os.O_RDONLY)
        target = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            copied = _copy(source, target, 0)  # the bulk, while the file is still in view
            os.fsync(target)
            os.rename(path, hidden)  # what an earlier writer appends from here is never seen
            try:
                copied = _copy(source, target, copied)
                end, _ = _last_line(target, copied)
                if end != copied:
                    log.warning("cutting a torn last line off %s (%d bytes)", path, copied - end)
                    os.ftruncate(target, end)
                os.fsync(target)
                os.rename(copy, path)
            except BaseException:
                os.rename(hidden, path)  # as it was: the next takeover seals it again
                raise
        finally:
            os.close(source)
            os.close(target)
        os.unlink(hidden)
        _fsync_dir(self.directory)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def _find_last_position(self) -> None:
        self.last_position = None
        for _, path in reversed(_numbered_files(self.directory)):
            fd = os.open(path, os.O_RDONLY)
            try:
                _, line = _last_line(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            if line is not None:
                self.last_position = decode(line).position
                return

    def _next_file(self) -> None:
        """Under the lock: start the file after the current one (its directory entry is the
        caller's to fsync)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._number += 1
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        self._fd = os.open(self.current_file, flags, 0o644)
        self._size = 0

    def _rotate(self, token: int) -> None:
        with self._locked():
            self._check_not_sealed(token)
            self._next_file()
        _fsync_dir(self.directory)

    def _check_not_sealed(self, token: int) -> None:
        """Raise if a newer writer sealed the current file: it is not the one named any more
        (this object's open file keeps its inode number from being reused)."""
        try:
            if os.stat(self.current_file).st_ino == os.fstat(self._fd).st_ino:
                return
        except FileNotFoundError:  # hidden while a takeover copies it
            pass
        self._token = None
        fence = self._read_fence()
        if fence is not None and fence > token:
            raise OutputFenced(f"ndjson output {self.directory}", token, fence)
        raise OutputUnavailable(
            f"{self.current_file}: taken over by another writer with lease token {fence}"
        )

    def fence(self, source: str) -> int | None:
        """The fence file's token (one source per directory)."""
        with self._unavailable(self.fence_file):
            return self._read_fence()

    def _read_fence(self) -> int | None:
        try:
            fd = os.open(self.fence_file, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            data = os.read(fd, 64)
        finally:
            os.close(fd)
        try:
            return int(data)
        except ValueError:
            raise OutputError(
                f"{self.fence_file} holds {data[:40].decode(errors='replace')!r}, not a lease "
                "token: remove it (the next writer writes it again)"
            ) from None

    def _write_fence(self, token: int) -> None:
        """Replace the fence file atomically and durably."""
        temporary = self.directory / f"{FENCE_FILE}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{token}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.fence_file)
        _fsync_dir(self.directory)

    def write(self, events: Sequence[Event], token: int) -> None:
        self.write_items(events, token)

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
        """Events as their lines, a chunk's page as its lines as they are: the whole page is
        one piece of one write unless a file ends inside it."""
        if self._lock < 0:
            raise OutputError(f"ndjson output {self.directory} is closed")
        if not items:
            return
        if self._token != token:
            self._take(token)
        kept = self._unreplayed(items)
        pieces: list[bytes] = []
        owners: list[Event | Lines] = []
        start = 0
        for index, item in enumerate(kept):
            if isinstance(item, Lines):
                if start < index:  # `encode_lines` builds its encoders a call
                    events = cast(list[Event], kept[start:index])
                    pieces += encode_lines(events)
                    owners += events
                pieces.append(item.data)
                owners.append(item)
                start = index + 1
        if start < len(kept):
            events = cast(list[Event], kept[start:])
            pieces += encode_lines(events)
            owners += events
        self._append_pieces(pieces, owners, token)

    def _unreplayed(self, items: Sequence[Event | Lines]) -> list[Event | Lines]:
        """`drop_replayed` of events and pages: what comes after the last position written."""
        kept: list[Event | Lines] = []
        last = self.last_position
        skipped = start = 0
        for index in range(len(items) + 1):
            item = items[index] if index < len(items) else None
            if item is not None and not isinstance(item, Lines):
                continue
            if start < index:
                run = cast(list[Event], items[start:index])
                events = drop_replayed(run, last)
                if kept and len(events) < len(run):
                    raise OutputError(
                        f"event at {run[0].position} after {last} in one batch: positions must "
                        "strictly increase in output order"
                    )
                skipped += len(run) - len(events)
                kept += events
                last = events[-1].position if events else last
            start = index + 1
            if item is None:
                break
            rest = item if last is None else item.after(last)
            if rest is not item:
                if kept:
                    raise OutputError(
                        f"lines at {item.first_position} after {last} in one batch: positions "
                        "must strictly increase in output order"
                    )
                skipped += len(item) - (len(rest) if rest else 0)
            if rest is not None:
                kept.append(rest)
                last = rest.last_position
        if skipped:
            log.info("skipped %d replayed events", skipped)
        return kept

    def _append_pieces(self, pieces: list[bytes], owners: list[Event | Lines], token: int) -> None:
        """Write the pieces (an event's line, a page's lines) in as few writes as the files
        allow, each fsynced and checked to have gone to the file named; a page is cut at a
        line where a file ends."""
        ends = list(accumulate(map(len, pieces)))  # ends[i]: the bytes of pieces[: i + 1]
        start = 0
        while start < len(pieces):
            room = self.max_bytes - self._size
            before = ends[start - 1] if start else 0
            end = bisect_right(ends, before + room, lo=start)
            if end == start:  # the next piece does not fit in what is left of this file
                owner = owners[start]
                if isinstance(owner, Lines):
                    fits, rest = owner.cut(room)
                    if rest is not None and (len(fits.data) <= room or not self._size):
                        pieces[start : start + 1] = [fits.data, rest.data]
                        owners[start : start + 1] = [fits, rest]
                        ends = list(accumulate(map(len, pieces)))
                        continue
                if self._size:
                    with self._unavailable(self.directory):
                        self._rotate(token)
                    continue
                end = start + 1  # a single larger event still gets a file of its own
            with self._unavailable(self.current_file):
                self._append(b"".join(pieces[start:end]))
                self._check_not_sealed(token)
            owner = owners[end - 1]
            self.last_position = owner.last_position if isinstance(owner, Lines) else owner.position
            start = end

    def _append(self, data: bytes) -> None:
        """Write and fsync `data`; on failure cut the file back, so no torn line stays behind
        for the next batch to be appended to (and if even that fails, the next batch takes the
        directory over again, which cuts it)."""
        before = self._size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, before)
            raise
        self._size = before + len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
