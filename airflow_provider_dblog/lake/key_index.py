"""A key index beside a table keyed by one integer or text column: each data file's keys as
one sorted array (int64, or fixed-width byte strings), so that a write with deletion vectors
finds the rows its keys fall on by a binary search of a memory-mapped array instead of
opening the Parquet file and decoding its key column (docs/adr/0010-key-index.md).

A fold of 20k random keys into a 50M-row table reads 500 files of 100k rows. Opening one and
decoding its integer key column (sorted, delta-encoded) takes 0.7 ms; a text key column
2.5-4 ms, then a hash probe of its strings 1.7 ms more. The index takes 0.07 ms a file (500
of the bench's 50M-row table's files, 40 keys each), 0.03 ms of it opening the array.

An index is derived from a data file, which never changes once written: it is written beside
the file when a write adds it (`LakeTable._commit`) or first reads it, never changed, and
ignored where it does not match the file's row count (rebuilt). It lives in a directory whose
name starts with `_`, which Delta readers skip. A file gets none where the array would not
stand for its keys exactly: keys not strictly increasing, a null; for text, a key ending in a
NUL byte (padding would confuse "a" with "a\\0"), or keys so uneven in length that padding
them would take more than `MAX_PADDING` times their bytes. Pure but for `load`, `save` and
`remove_orphans`.
"""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path
from urllib.parse import unquote

import numpy
import pyarrow as pa

from airflow_provider_dblog.lake.clustered import sorted_rows_holding

DIRECTORY = "_dblog_key_index"
"""The directory, in a table's, of its files' key indexes, one `<data file's name>.keys` each."""
SUFFIX = ".keys"
HEADER = 16
"""The bytes before an index's array: its numpy type ("<i8", "|S17"), space-padded."""
MAX_PADDING = 4
"""An index may take at most this many times its keys' bytes (padding to the longest)."""


def built(keys: pa.Array | pa.ChunkedArray) -> numpy.ndarray | None:
    """The index of a file's key column `keys` (its rows in order): integers as int64, text
    as UTF-8 NUL-padded to the longest; None where that would not stand for them exactly
    (see the module's docstring), or for another type."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.null_count:
        return None
    index: numpy.ndarray | None = None
    if pa.types.is_integer(keys.type):
        index = keys.to_numpy().astype(numpy.int64)
    elif pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        index = _padded(keys.cast(pa.large_binary()))
    if index is None:
        return None
    if len(index) > 1 and not bool(numpy.all(index[1:] > index[:-1])):
        return None
    return index


def _padded(keys: pa.LargeBinaryArray) -> numpy.ndarray | None:
    """`keys` NUL-padded to the longest, as fixed-width byte strings; None where a key ends
    in NUL or the padding would take more than `MAX_PADDING` times their bytes."""
    offsets = numpy.frombuffer(keys.buffers()[1], dtype=numpy.int64)
    offsets = offsets[keys.offset : keys.offset + len(keys) + 1]
    lengths = numpy.diff(offsets)
    width = max(1, int(lengths.max(initial=0)))
    if width * len(keys) > MAX_PADDING * max(1, int(lengths.sum())):
        return None
    data = numpy.frombuffer(keys.buffers()[2] or b"", dtype=numpy.uint8)
    data = data[offsets[0] : offsets[-1]]
    ends = offsets[1:] - offsets[0] - 1
    if bool(numpy.any(data[ends[lengths > 0]] == 0)):
        return None
    padded = numpy.zeros((len(keys), width), dtype=numpy.uint8)
    rows = numpy.repeat(numpy.arange(len(keys)), lengths)
    columns = numpy.arange(len(data)) - numpy.repeat(offsets[:-1] - offsets[0], lengths)
    padded[rows, columns] = data
    found: numpy.ndarray = padded.view(f"S{width}").ravel()
    return found


def rows_of(index: numpy.ndarray, keys: numpy.ndarray) -> numpy.ndarray:
    """The rows of the file of `index` whose key is one of `keys` (sorted, unique; int64 or
    Python strings), in order: a binary search of each."""
    if index.dtype.kind == "i":
        return sorted_rows_holding(index, keys)
    width = index.dtype.itemsize
    spelled = [k.encode() for k in keys]
    probes = [s for s in spelled if len(s) <= width and not s.endswith(b"\0")]
    return sorted_rows_holding(index, numpy.array(probes, dtype=f"S{width}"))


def keys_at(index: numpy.ndarray, rows: numpy.ndarray, kind: pa.DataType) -> pa.Array:
    """The keys of the file of `index` at `rows`, as an array of the column's type `kind`
    (an unsigned 64-bit key is stored as int64 bits, as `clustered.key_array` orders it)."""
    if index.dtype.kind == "i":
        return pa.array(index[rows]).cast(kind, safe=False)
    return pa.array([bytes(k).decode() for k in index[rows]], kind)


def path(directory: str | Path, data_file: str) -> Path:
    """Where the index of the data file `data_file` (as the log names it) is."""
    return Path(directory) / DIRECTORY / f"{Path(unquote(data_file)).name}{SUFFIX}"


def load(directory: str | Path, data_file: str, rows: int | None) -> numpy.ndarray | None:
    """The index of the data file `data_file` (of `rows` rows, if known), memory-mapped; None
    if it has none, or one of another length. Its file is the array's numpy type, in ASCII
    padded to `HEADER` bytes, then its bytes: opened in a tenth of what `numpy.load` takes."""
    try:
        with open(path(directory, data_file), "rb") as file:
            header = file.read(HEADER)
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except (FileNotFoundError, ValueError):  # none, or an empty file (mmap refuses it)
        return None
    try:
        kind = numpy.dtype(header.decode("ascii").strip())
    except (UnicodeDecodeError, TypeError, ValueError):
        return None
    count, extra = divmod(len(mapped) - HEADER, kind.itemsize or 1)
    if kind.kind not in "iS" or extra or count < 0 or (rows is not None and count != rows):
        return None
    return numpy.frombuffer(mapped, kind, count=count, offset=HEADER)


def save(directory: str | Path, data_file: str, index: numpy.ndarray) -> Path:
    """Write the index of the data file `data_file`, whole or not at all (two writers write
    the same); its path."""
    target = path(directory, data_file)
    target.parent.mkdir(exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    with open(partial, "wb") as out:
        out.write(index.dtype.str.encode("ascii").ljust(HEADER))
        out.write(numpy.ascontiguousarray(index).tobytes())
    os.replace(partial, target)
    return target


def remove_orphans(directory: str | Path, partial_before: float) -> list[str]:
    """Remove the indexes whose data file is gone (a vacuum removed it), and the partial ones
    last changed before `partial_before` (a time: their writer died); their names."""
    found = Path(directory) / DIRECTORY
    if not found.is_dir():
        return []
    removed = []
    for index in found.iterdir():
        if index.name.startswith("."):
            try:
                orphan = index.stat().st_mtime < partial_before
            except FileNotFoundError:  # its writer renamed it meanwhile
                continue
        else:
            orphan = not (Path(directory) / index.name.removesuffix(SUFFIX)).exists()
        if orphan:
            index.unlink(missing_ok=True)
            removed.append(index.name)
    return sorted(removed)
