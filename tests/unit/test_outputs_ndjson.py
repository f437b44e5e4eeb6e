"""The NDJSON output: rotation, fsync per batch, torn lines repaired, replays dropped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_dblog.core.event import Event, Op, Origin, SourceInfo, encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs import open_output
from airflow_provider_dblog.outputs.base import OutputError
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, event_files, read_events

pytestmark = pytest.mark.unit


def event(commit: int, seq: int = 0, *, op: Op = Op.UPDATE, text: str = "x") -> Event:
    source = SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG, txid=7)
    row = {"id": commit, "name": text, "tags": ["a", "ü"], "doc": {"k": [1, None]}}
    return Event(op, {"id": commit}, None, row, source, 1)


def test_read_back_equals_written(tmp_path: Path) -> None:
    events = [event(c, s) for c in range(1, 4) for s in range(3)]
    with NdjsonOutput(tmp_path) as out:
        out.write(events[:4])
        out.write(events[4:])
    assert list(read_events(tmp_path)) == events
    assert [p.name for p in event_files(tmp_path)] == ["events-000001.ndjson"]


def test_encoding_is_stable_one_line_per_event(tmp_path: Path) -> None:
    events = [event(1, text="line\nbreak"), event(2, text="ü")]
    with NdjsonOutput(tmp_path) as out:
        out.write(events)
    data = (tmp_path / "events-000001.ndjson").read_bytes()
    assert data == "".join(encode(e) + "\n" for e in events).encode()
    assert data.count(b"\n") == 2
    assert "ü" in data.decode()


def test_rotates_by_size_at_line_boundaries(tmp_path: Path) -> None:
    line = len(encode(event(10)).encode()) + 1
    with NdjsonOutput(tmp_path, max_bytes=3 * line) as out:
        out.write([event(c) for c in range(10, 17)])
        out.write([event(17)])
    files = event_files(tmp_path)
    assert [p.name for p in files] == [f"events-00000{i}.ndjson" for i in (1, 2, 3)]
    assert [p.stat().st_size for p in files] == [3 * line, 3 * line, 2 * line]
    assert [e.position.commit for e in read_events(tmp_path)] == list(range(10, 18))


def test_an_event_larger_than_max_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path, max_bytes=10) as out:
        out.write([event(1), event(2)])
    assert len(event_files(tmp_path)) == 2
    assert len(list(read_events(tmp_path))) == 2


def test_files_sort_by_number_past_six_digits(tmp_path: Path) -> None:
    for number in (999_999, 1_000_000, 2):
        (tmp_path / f"events-{number:06d}.ndjson").write_text(encode(event(number)) + "\n")
    assert [e.position.commit for e in read_events(tmp_path)] == [2, 999_999, 1_000_000]
    with NdjsonOutput(tmp_path) as out:
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
    assert synced == [inode(tmp_path)]  # the first file's directory entry
    out.write([event(1)])
    out.write([event(2)])
    out.close()
    assert synced == [
        inode(tmp_path),
        inode(tmp_path / "events-000001.ndjson"),
        inode(tmp_path),
        inode(tmp_path / "events-000002.ndjson"),
    ]


def test_torn_last_line_is_hidden_then_cut_on_open(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1), event(2)])
    path = tmp_path / "events-000001.ndjson"
    whole = path.read_bytes()
    torn = encode(event(3)).encode()[:25]
    path.write_bytes(whole + torn)
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]
    with NdjsonOutput(tmp_path) as out:
        assert path.read_bytes() == whole
        assert out.last_position == Position(2, 0)
        out.write([event(3)])
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2, 3]


def test_a_file_holding_only_a_torn_line_is_emptied(tmp_path: Path) -> None:
    line = len(encode(event(1)).encode()) + 1
    with NdjsonOutput(tmp_path, max_bytes=line) as out:
        out.write([event(1)])
    (tmp_path / "events-000002.ndjson").write_bytes(b'{"op":"c","ke')
    with NdjsonOutput(tmp_path, max_bytes=line) as out:
        assert (tmp_path / "events-000002.ndjson").stat().st_size == 0
        assert out.last_position == Position(1, 0)
        out.write([event(2)])
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]


def test_torn_line_in_an_earlier_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "events-000001.ndjson").write_text(encode(event(1))[:10])
    (tmp_path / "events-000002.ndjson").write_text(encode(event(2)) + "\n")
    with pytest.raises(ValueError, match=r"events-000001\.ndjson:1: torn line"):
        list(read_events(tmp_path))


def test_replayed_events_are_skipped_across_reopen(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out:
        out.write([event(1), event(2, 0), event(2, 1)])
    with NdjsonOutput(tmp_path) as out:
        out.write([event(2, 0), event(2, 1), event(3)])  # a tailer restart replays from 2
    assert [e.position for e in read_events(tmp_path)] == [
        Position(1, 0),
        Position(2, 0),
        Position(2, 1),
        Position(3, 0),
    ]


def test_positions_going_backwards_inside_a_batch_fail(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path) as out, pytest.raises(OutputError, match="strictly increase"):
        out.write([event(5), event(4)])
    assert list(read_events(tmp_path)) == []


def test_a_failed_write_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = NdjsonOutput(tmp_path)
    out.write([event(1)])
    real_write = os.write

    def half_then_fail(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        out.write([event(2)])
    monkeypatch.undo()
    out.write([event(2)])
    out.close()
    assert [e.position.commit for e in read_events(tmp_path)] == [1, 2]


def test_one_writer_per_directory(tmp_path: Path) -> None:
    with NdjsonOutput(tmp_path), pytest.raises(OutputError, match="another writer"):
        NdjsonOutput(tmp_path)
    NdjsonOutput(tmp_path).close()  # the lock is released on close


def test_closed_output_refuses_writes(tmp_path: Path) -> None:
    out = NdjsonOutput(tmp_path)
    out.close()
    with pytest.raises(OutputError, match="closed"):
        out.write([event(1)])


def test_factory_opens_ndjson(tmp_path: Path) -> None:
    with open_output({"type": "ndjson", "directory": str(tmp_path), "max_bytes": 100}) as out:
        assert isinstance(out, NdjsonOutput)
        assert out.max_bytes == 100
    with pytest.raises(OutputError, match="unknown output type 'kafka'"):
        open_output({"type": "kafka"})
    with pytest.raises(OutputError, match="ndjson output: unknown option 'dir'"):
        open_output({"type": "ndjson", "dir": str(tmp_path)})
