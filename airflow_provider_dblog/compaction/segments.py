"""The compaction's input: the tailer's event files cut into segments the executors read in
parallel, and the read cursor (`CompactState`, `_compact_state.json`) saying where the last run
stopped reading. A file is only ever appended to, so a run reads the bytes after the cursor; the
last file may end in a line still being written, which the next run reads whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_dblog.lake import CURSOR_FILE
from airflow_provider_dblog.outputs.ndjson import event_files

DEFAULT_SEGMENT_BYTES = 32 * 1024 * 1024
_BLOCK = 64 * 1024


@dataclass(frozen=True)
class Segment:
    """Bytes `[start, end)` of one event file; `first` is where the unread part of the file
    begins. A segment owns the lines that start inside it, so segments can cut lines anywhere."""

    path: str
    first: int
    start: int
    end: int


def read_segment(segment: Segment) -> Iterator[bytes]:
    """The complete lines that start in the segment (each ends before the unread part does)."""
    with open(segment.path, "rb") as f:
        f.seek(segment.start)
        if segment.start > segment.first:
            f.seek(segment.start - 1)
            f.readline()  # the line in progress belongs to the previous segment
        while f.tell() < segment.end:
            yield f.readline()


def complete_end(path: Path, start: int, size: int) -> int:
    """The offset just after the last newline in `[start, size)`, or `start` if there is none:
    a line without its newline is still being written."""
    with path.open("rb") as f:
        end = size
        while end > start:
            step = min(_BLOCK, end - start)
            f.seek(end - step)
            newline = f.read(step).rfind(b"\n")
            if newline >= 0:
                return end - step + newline + 1
            end -= step
    return start


def plan_segments(
    input_dir: Path, consumed: Mapping[str, int], segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> tuple[list[Segment], dict[str, int]]:
    """The segments to read after the `consumed` offsets (by file name), and the offsets after
    them. Only the last file may end in a partial line (it is being written)."""
    files = event_files(input_dir)
    segments: list[Segment] = []
    offsets = dict(consumed)
    for index, path in enumerate(files):
        first, size = consumed.get(path.name, 0), path.stat().st_size
        end = complete_end(path, first, size)
        if end != size and index != len(files) - 1:
            raise ValueError(f"{path}: torn line in a file that is not the last")
        for start in range(first, end, segment_bytes):
            segments.append(Segment(str(path), first, start, min(start + segment_bytes, end)))
        offsets[path.name] = end
    return segments, offsets


@dataclass
class CompactState:
    """Where the last run stopped reading: the bytes consumed of each event file and the last
    position read. Written after every table's commit, it only saves reading again: a run that
    died before writing it reads the same bytes again, and each table skips what its own
    progress (committed with its data) says it holds."""

    position: list[int] | None = None
    files: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, output_dir: Path) -> CompactState:
        path = output_dir / CURSOR_FILE
        if not path.exists():
            return cls()
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(data["position"], data["files"])

    def save(self, output_dir: Path) -> None:
        """Atomically: a crash leaves the old state or the new one, never half of either."""
        data = {"position": self.position, "files": self.files}
        tmp = output_dir / f".{CURSOR_FILE}.tmp"
        with tmp.open("w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output_dir / CURSOR_FILE)
        fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
