"""The NDJSON output: rotation, fsync per batch, torn lines repaired, replays dropped; writers
taking turns by lease token, a lock held by a stopped writer, a failing disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_provider_dblog.core.encoded_rows import (
    EncodedEvent,
    EncodedRows,
    PageLines,
    encode_rows,
)
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.event_codec import encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Reconciler, Window
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.outputs.base import OutputError, OutputFenced, OutputUnavailable
from airflow_provider_dblog.outputs.ndjson import (
    FENCE_FILE,
    LOCK_FILE,
    NdjsonOutput,
    event_files,
    read_events,
)
from airflow_provider_dblog.targets import open_output

pytestmark = pytest.mark.unit


def event(commit: int, seq: int = 0, *, op: Op = Op.UPDATE, text: str = "x") -> Event:
    source = SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG, txid=7)
    row = {"id": commit, "name": text, "tags": ["a", "ü"], "doc": {"k": [1, None]}}
    return PlainEvent(op, {"id": commit}, None, row, source, 1)


def test_read_back_equals_written(tmp_path: Path) -> None:
    events = [event(c, s) for c in range(1, 4) for s in range(3)]
    with NdjsonOutput(tmp_path) as out:
        out.write(events[:4], 1)
        out.write(events[4:], 1)
    assert list(read_events(tmp_path)) == events
    assert [p.name for p in event_files(tmp_path)] == ["events-000001.ndjson"]


def test_table_level_events_are_carried_in_place(tmp_path: Path) -> None:
    """A truncate and a schema change are lines of their own between the row events."""
    truncate = table_event(Op.TRUNCATE, event(2, 1).source, 1)
    columns = (Column("id", "bigint", False, None), Column("flag", "integer", True, "7"))
    schema = table_event(Op.SCHEMA, event(3, 0).source, 2, TableSchema(columns, ("id",)))
    events = [event(2), truncate, schema, event(3, 1)]
    with NdjsonOutput(tmp_path) as out:
        out.write(events, 1)
    assert list(read_events(tmp_path)) == events
    lines = (tmp_path / "events-000001.ndjson").read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["u", "t", "s", "u"]


def test_encoding_is_stable_one_line_per_event(tmp_path: Path) -> None:
    events = [event(1, text="line\nbreak"), event(2, text="ü")]
    with NdjsonOutput(tmp_path) as out:
        out.write(events, 1)
    data = (tmp_path / "events-000001.ndjson").read_bytes()
    assert data == "".join(encode(e) + "\n" for e in events).encode()
    assert data.count(b"\n") == 2
    assert "ü" in data.decode()


def test_rotates_by_size_at_line_boundaries(tmp_path: Path) -> None:
    line = len(encode(event(10)).encode()) + 1
    with NdjsonOutput(tmp_path, max_bytes=3 * line) as out:
        out.write([event(c) for c in range(10, 17)], 1)
        out.write([event(17)], 1)
    files = event_files(tmp_path)
    assert [p.name for p in files] == [f"events-00000{i}.ndjson" for i in (1, 2, 3)]
    assert [p.stat().st_size for p in files] == [3 * line, 3 * line, 2 * line]
    assert [e.position.commit for e in read_events(tmp_path)] == list(range(10, 18))


def test_an_event_larger_than_max_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path, max_bytes=10) as out:
        out.write([event(1), event(2)], 1)
    assert len(event_files(tmp_path)) == 2
    assert len(list(read_events(tmp_path))) == 2


def test_files_sort_by_number_past_six_digits(tmp_path: Path) -> None:
    for number in (999_999, 1_000_000, 2):
        (tmp_path / f"events-{number:06d}.ndjson").write_text(encode(event(number)) + "\n")
    assert [e.position.commit for e in read_events(tmp_path)] == [2, 999_999, 1_000_000]
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1_000_000)], 1)  # a replay
        assert out.current_file.name == "events-1000000.ndjson"
        assert out.last_position == Position(1_000_000, 0)


def test_each_batch_is_fsynced_and_a_new_file_also_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []  # inode numbers of what was fsynced
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def inode(path: Path) -> int:
        return path.stat().st_ino

    monkeypatch.setattr(os, "fsync", fsync)
    out = NdjsonOutput(tmp_path, max_bytes=len(encode(event(1)).encode()) + 1)
    assert synced == []  # opening writes nothing
    out.write([event(1)], 1)
    out.write([event(2)], 1)
    out.close()
    assert synced == [
        inode(tmp_path / FENCE_FILE),  # the first batch records its writer's token
        inode(tmp_path),
        inode(tmp_path),  # the first file's directory entry
        inode(tmp_path / "events-000001.ndjson"),
        inode(tmp_path),
        inode(tmp_path / "events-000002.ndjson"),
    ]


def test_torn_last_line_is_hidden_then_cut_by_the_next_writer(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1), event(2)], 1)
    path = tmp_path / "events-000001.ndjson"
    whole = path.read_bytes()
    torn = encode(event(3)).encode()[:25]
    path.write_bytes(whole + torn)
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]
    with NdjsonOutput(tmp_path) as out:
        out.write([event(2), event(3)], 1)
        assert out.last_position == Position(3, 0)
    assert path.read_bytes() == whole + encode(event(3)).encode() + b"\n"
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


def test_a_file_holding_only_a_torn_line_is_emptied(tmp_path: Path) -> None:
    line = len(encode(event(1)).encode()) + 1
    with NdjsonOutput(tmp_path, max_bytes=line) as out:
        out.write([event(1)], 1)
    (tmp_path / "events-000002.ndjson").write_bytes(b'{"op":"c","ke')
    with NdjsonOutput(tmp_path, max_bytes=line) as out:
        out.write([event(1), event(2)], 1)
    assert (tmp_path / "events-000002.ndjson").read_bytes() == encode(event(2)).encode() + b"\n"
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]


def test_torn_line_in_an_earlier_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "events-000001.ndjson").write_text(encode(event(1))[:10])
    (tmp_path / "events-000002.ndjson").write_text(encode(event(2)) + "\n")
    with pytest.raises(ValueError, match=r"events-000001\.ndjson:1: torn line"):
        list(read_events(tmp_path))


def test_replayed_events_are_skipped_across_reopen(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1), event(2, 0), event(2, 1)], 1)
    with NdjsonOutput(tmp_path) as out:
        out.write([event(2, 0), event(2, 1), event(3)], 1)  # a tailer restart replays from 2
    assert [e.position for e in read_events(tmp_path)] == [
        Position(1, 0),
        Position(2, 0),
        Position(2, 1),
        Position(3, 0),
    ]


def test_positions_going_backwards_inside_a_batch_fail(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out, pytest.raises(OutputError, match="strictly increase"):
        out.write([event(5), event(4)], 1)
    assert list(read_events(tmp_path)) == []


def test_a_failed_write_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = NdjsonOutput(tmp_path)
    out.write([event(1)], 1)
    real_write = os.write

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OutputUnavailable, match=r"events-000001\.ndjson: .*No space"):
        out.write([event(2)], 1)
    monkeypatch.undo()
    out.write([event(2)], 1)
    out.close()
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]


def test_a_failed_fsync_is_unavailable_and_the_batch_lands_once_on_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = NdjsonOutput(tmp_path)
    out.write([event(1)], 1)
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(
        OutputUnavailable, match=r"cannot write .*events-000001\.ndjson: .*Input/output"
    ):
        out.write([event(2), event(3)], 1)
    monkeypatch.setattr(os, "fsync", real_fsync)
    out.write([event(2), event(3)], 1)
    out.close()
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


def test_a_stale_token_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as old, NdjsonOutput(tmp_path) as new:
        old.write([event(1), event(2)], 5)
        new.write([event(2), event(3)], 7)  # the new leader replays from 2
        before = (tmp_path / "events-000001.ndjson").read_bytes()
        with pytest.raises(OutputFenced, match=r"token 7 has written here; .* token 5 is stale"):
            old.write([event(4, text="stale")], 5)
        assert (tmp_path / "events-000001.ndjson").read_bytes() == before
        new.write([event(4)], 7)
        with pytest.raises(OutputFenced):
            old.write([event(5, text="stale")], 5)  # refused every time, not only once
    written = list(read_events(tmp_path))
    assert [e.position.commit for e in written] == [1, 2, 3, 4]
    assert all(e.after is not None and e.after["name"] == "x" for e in written)
    assert (tmp_path / FENCE_FILE).read_text() == "7\n"


def test_leaders_alternating_see_each_others_files(tmp_path: Path) -> None:
    """Each writer opened before the other wrote: a new token reads the directory again (last
    position, current file and its size, rotation), so no line is lost, doubled or torn."""
    line = len(encode(event(10)).encode()) + 1
    first = NdjsonOutput(tmp_path, max_bytes=2 * line)
    second = NdjsonOutput(tmp_path, max_bytes=2 * line)
    third = NdjsonOutput(tmp_path, max_bytes=2 * line)
    first.write([event(c) for c in range(10, 13)], 1)  # two files
    second.write([event(c) for c in range(11, 15)], 2)  # 11 and 12 are replays
    with pytest.raises(OutputFenced):
        first.write([event(15)], 1)
    third.write([event(c) for c in range(14, 17)], 3)
    with pytest.raises(OutputFenced):
        second.write([event(17)], 2)
    third.write([event(17)], 3)
    for out in (first, second, third):
        out.close()
    files = event_files(tmp_path)
    assert [p.stat().st_size for p in files] == [2 * line, 2 * line, 2 * line, 2 * line]
    assert [e.position.commit for e in read_events(tmp_path)] == list(range(10, 18))


def test_a_new_leader_cuts_the_torn_line_a_crashed_one_left(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as old, NdjsonOutput(tmp_path) as new:
        old.write([event(1)], 1)
        with (tmp_path / "events-000001.ndjson").open("ab") as f:
            f.write(encode(event(2)).encode()[:20])  # the old leader died mid-batch
        new.write([event(2), event(3)], 2)
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


@contextmanager
def lock_held_elsewhere(directory: Path) -> Iterator[None]:
    """Another process holding the directory's lock, as a writer stopped mid-batch does; it
    dies on leaving the block, and the kernel releases its lock."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX);"
            " print('locked', flush=True); sys.stdin.read()",
            str(directory / LOCK_FILE),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        yield
    finally:
        holder.kill()
        holder.wait()


def test_batches_take_no_lock_a_takeover_waits_for_it_then_is_unavailable(
    tmp_path: Path,
) -> None:
    """Another process holding the lock (as a writer stopped while it takes the directory over
    does) holds up takeovers and new files only, and only for `lock_timeout_s`."""
    line = len(encode(event(1)).encode()) + 1
    out = NdjsonOutput(tmp_path, lock_timeout_s=0.2, max_bytes=2 * line)
    out.write([event(1)], 1)
    with lock_held_elsewhere(tmp_path):
        out.write([event(2)], 1)
        with pytest.raises(OutputUnavailable, match=r"\.lock: lock held by another writer"):
            out.write([event(3)], 1)  # a new file
        with pytest.raises(OutputUnavailable, match=r"lock held by another writer for 0\.2s"):
            NdjsonOutput(tmp_path, lock_timeout_s=0.2).write([event(3)], 2)
    out.write([event(3)], 1)  # the same object carries on once the lock is free
    out.close()
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


def test_a_sealed_writer_writes_where_nobody_reads_and_starts_no_file(tmp_path: Path) -> None:
    """The old writer's open file is sealed by the new one's takeover: bytes it still writes
    through it (waking in the middle of a batch) never show, and its next file is refused."""
    line = len(encode(event(1)).encode()) + 1
    old = NdjsonOutput(tmp_path, max_bytes=2 * line)
    new = NdjsonOutput(tmp_path, max_bytes=2 * line)
    old.write([event(1), event(2)], 5)  # its file is full: its next batch starts one
    held = os.dup(old._fd)  # what a writer stopped in the middle of a batch holds
    new.write([event(2), event(3)], 7)
    os.write(held, encode(event(3, text="stale")).encode() + b"\n")
    os.close(held)
    with pytest.raises(OutputFenced, match=r"token 7 has written here; .* token 5 is stale"):
        old.write([event(3, text="stale")], 5)
    new.write([event(4)], 7)
    old.close()
    new.close()
    written = list(read_events(tmp_path))
    assert [e.position.commit for e in written] == [1, 2, 3, 4]
    assert all(e.after is not None and e.after["name"] == "x" for e in written)
    assert [p.name for p in event_files(tmp_path)] == [
        "events-000001.ndjson",
        "events-000002.ndjson",
    ]


def test_a_seal_a_crash_cut_short_is_undone_by_the_next_takeover(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1), event(2)], 1)
    path = tmp_path / "events-000001.ndjson"
    os.rename(path, tmp_path / ".events-000001.ndjson.sealed")  # crashed while copying
    (tmp_path / ".events-000001.ndjson.copy").write_bytes(b"half a cop")
    with NdjsonOutput(tmp_path) as out:
        out.write([event(2), event(3)], 2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".events")) == []
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


def test_an_empty_batch_takes_nothing_over(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([], 3)
        assert not (tmp_path / FENCE_FILE).exists()
        out.write([event(1)], 1)
    assert [e.position.commit for e in read_events(tmp_path)] == [1]


def test_closed_output_refuses_writes(tmp_path: Path) -> None:
    out = NdjsonOutput(tmp_path)
    out.close()
    with pytest.raises(OutputError, match="closed"):
        out.write([event(1)], 1)


def test_factory_opens_ndjson(tmp_path: Path) -> None:
    config = {"type": "ndjson", "directory": str(tmp_path), "max_bytes": 100, "lock_timeout_s": 1}
    with open_output(config) as out:
        assert isinstance(out, NdjsonOutput)
        assert (out.max_bytes, out.lock_timeout_s) == (100, 1)
    with pytest.raises(OutputError, match="unknown output type 'kafka'"):
        open_output({"type": "kafka"})
    with pytest.raises(OutputError, match="ndjson output: unknown option 'dir'"):
        open_output({"type": "ndjson", "dir": str(tmp_path)})


def encoded_chunk(commit: int, count: int, *, first_seq: int = 1) -> list[Event]:
    """`count` dump rows of a window closed at `commit`, as the tailer emits them: encoded."""
    rows = [{"id": i, "name": f"ü{i}", "doc": {"k": [i, None]}} for i in range(count)]
    window = Window("w-1", "d-1", TableRef("app", "users"))
    closed = Closed(window, Position(commit - 1, 0), Position(commit, first_seq - 1), frozenset())
    chunk = ChunkRows("w-1", ("id",), encode_rows(rows, ("id",)), 1)
    events = Reconciler("src", "db").chunk_events(closed, chunk)
    assert isinstance(events, list) and all(isinstance(e, EncodedEvent) for e in events)
    return events


def test_encoded_chunk_rows_are_written_as_encoded(tmp_path: Path) -> None:
    """A chunk's encoded lines go to the files as they are, between log events, across a
    rotation and a batch that holds part of a page; a replayed part of a page is skipped."""
    chunk = encoded_chunk(5, 40)
    events = [event(4), *chunk, event(6)]
    with NdjsonOutput(tmp_path, max_bytes=2000) as out:
        out.write(events[:15], 1)
        out.write(events[10:30], 1)  # a restart replays part of the page
        out.write(events[30:], 1)
    back = list(read_events(tmp_path))
    assert back == events
    raw = b"".join(path.read_bytes() for path in event_files(tmp_path))
    assert raw == b"".join(encode(e).encode() + b"\n" for e in events)
    assert len(event_files(tmp_path)) > 1


def test_encoded_rows_going_backwards_fail(tmp_path: Path) -> None:
    chunk = encoded_chunk(5, 3)
    with NdjsonOutput(tmp_path) as out, pytest.raises(OutputError, match="strictly increase"):
        out.write([*chunk, chunk[0]], 1)
    with NdjsonOutput(tmp_path) as out, pytest.raises(OutputError, match="strictly increase"):
        out.write([event(9), *chunk], 1)


def chunk_pages(commit: int, count: int, page: int) -> list[PageLines]:
    """`count` dump rows of a window closed at `commit` as the tailer hands them over: pages of
    `page` rows stamped into their lines."""
    rows = [{"id": i, "name": f"ü{i}", "doc": {"k": [i, None]}} for i in range(count)]
    window = Window("w-1", "d-1", TableRef("app", "users"))
    closed = Closed(window, Position(commit - 1, 0), Position(commit, 0), frozenset())
    encoded = encode_rows(rows, ("id",))
    reconciler = Reconciler("src", "db")
    pages: list[PageLines] = []
    for start in range(0, count, page):
        part = EncodedRows(encoded.keys[start : start + page], encoded.values[start : start + page])
        stamped = reconciler.chunk_page(
            closed, ChunkRows("w-1", ("id",), part, 1, emitted_before=start)
        )
        assert isinstance(stamped, PageLines)
        pages.append(stamped)
    return pages


def test_pages_of_chunk_lines_are_written_as_their_events_are(tmp_path: Path) -> None:
    """A chunk's pages give the files the bytes its events give, across rotations that end a
    file inside a page; a replay that ends inside a page keeps the rest of that page only."""
    pages = chunk_pages(5, 40, 15)
    events = [event(4), *(e for p in pages for e in p.events()), event(6)]
    items: list[Event | PageLines] = [event(4), *pages, event(6)]
    with NdjsonOutput(tmp_path / "pages", max_bytes=2000) as out:
        out.write_items(items[:2], 1)
        out.write_items(items[1:], 1)  # a restart replays the first page
    with NdjsonOutput(tmp_path / "events", max_bytes=2000) as out:
        out.write(events, 1)
    assert list(read_events(tmp_path / "pages")) == events
    files = event_files(tmp_path / "pages")
    assert [p.read_bytes() for p in files] == [
        p.read_bytes() for p in event_files(tmp_path / "events")
    ]
    assert len(files) > 1 and all(p.stat().st_size <= 2000 for p in files)

    with NdjsonOutput(tmp_path / "part", max_bytes=10**6) as out:
        out.write(events[:8], 1)
        out.write_items(items[1:], 1)  # the replay ends inside the first page
    assert list(read_events(tmp_path / "part")) == events


def test_a_page_going_backwards_in_a_batch_is_refused(tmp_path: Path) -> None:
    (page,) = chunk_pages(5, 3, 3)
    with NdjsonOutput(tmp_path) as out, pytest.raises(OutputError, match="strictly increase"):
        out.write_items([event(6), page], 1)
    assert list(read_events(tmp_path)) == []


def test_a_page_cut_and_replayed_keeps_its_lines_and_positions() -> None:
    (page,) = chunk_pages(5, 10, 10)
    lines = page.data.splitlines(keepends=True)
    fits, rest = page.cut(len(lines[0]) + len(lines[1]) + 5)
    assert rest is not None and (fits.first, fits.last, rest.first, rest.last) == (1, 2, 3, 10)
    assert fits.data + rest.data == page.data and len(fits) + len(rest) == len(page)
    assert page.cut(1)[0].data == lines[0], "at least one line"
    assert page.cut(len(page.data)) == (page, None)
    after = page.after(Position(5, 7))
    assert after is not None and after.data == b"".join(lines[7:]) and after.first == 8
    assert page.after(Position(5, 10)) is None and page.after(Position(4, 99)) is page
    assert [e.position for e in page.events()] == [Position(5, s) for s in range(1, 11)]
