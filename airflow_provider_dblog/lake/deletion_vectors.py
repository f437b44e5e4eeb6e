"""Delta deletion vectors as the Delta protocol stores them: which rows of a data file are
deleted, kept beside the file instead of rewriting it (docs/adr/0009-deletion-vectors.md).

delta-rs reads tables with deletion vectors and keeps them when it writes, but writes none
itself; `LakeTable` writes them through here. A vector is a 64-bit roaring bitmap of row
indexes in "portable" serialization (the magic number, the count of 32-bit bitmaps, each one's
key and its roaring serialization with array and bitmap containers), stored in a file
`deletion_vector_<uuid>.bin` at the table's root: a format version byte, then per vector its
size (big-endian), its bytes and their CRC-32. The file action names it by the uuid in Z85.
Pure but for `stored_rows`, which reads a vector where its descriptor says.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy

MAGIC = 1681511377
"""The first four bytes of a serialized RoaringBitmapArray (Delta's 64-bit roaring)."""
_NO_RUN_COOKIE = 12346
_RUN_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096
"""A container of more rows than this is a bitset of 8 KiB, of fewer a sorted array."""
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def serialized(rows: numpy.ndarray) -> bytes:
    """The deleted row indexes `rows` (any order, each below 2**32: a data file's rows) as
    the portable RoaringBitmapArray Delta reads."""
    return _serialized_unique(numpy.unique(numpy.asarray(rows, dtype=numpy.uint64)))


def _serialized_unique(rows: numpy.ndarray) -> bytes:
    """`serialized` of sorted unique `rows`."""
    if len(rows) and int(rows[-1]) >= 2**32:
        raise ValueError("a deletion vector's row index must be below 2**32")
    head = struct.pack("<iqi", MAGIC, 1, 0)  # one 32-bit bitmap, its high key 0
    return head + _roaring32(rows.astype(numpy.uint32))


def deserialized(data: bytes) -> numpy.ndarray:
    """The row indexes a portable RoaringBitmapArray holds (the inverse of `serialized`, and
    of what Spark writes: run containers too), sorted."""
    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic {magic})")
    at, found = 12, []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, at)
        rows, at = _roaring32_rows(data, at + 4)
        found.append(rows.astype(numpy.uint64) | (numpy.uint64(high) << numpy.uint64(32)))
    return numpy.concatenate(found) if found else numpy.zeros(0, dtype=numpy.uint64)


def _roaring32_rows(data: bytes, at: int) -> tuple[numpy.ndarray, int]:
    """The values of the 32-bit roaring bitmap serialized at `at`, and where it ends."""
    (cookie,) = struct.unpack_from("<I", data, at)
    runs = b""
    if cookie & 0xFFFF == _RUN_COOKIE:
        count = (cookie >> 16) + 1
        runs = data[at + 4 : at + 4 + (count + 7) // 8]
        at += 4 + len(runs)
    elif cookie == _NO_RUN_COOKIE:
        (count,) = struct.unpack_from("<I", data, at + 4)
        at += 8
    else:
        raise ValueError(f"not a roaring bitmap (cookie {cookie})")
    header = numpy.frombuffer(data, dtype="<u2", count=2 * count, offset=at)
    at += 4 * count
    if cookie == _NO_RUN_COOKIE or count >= _NO_OFFSET_THRESHOLD:
        at += 4 * count  # the containers' offsets: they follow each other anyway
    found = []
    for index in range(count):
        key, cardinality = int(header[2 * index]), int(header[2 * index + 1]) + 1
        if runs and runs[index // 8] >> (index % 8) & 1:
            (pairs,) = struct.unpack_from("<H", data, at)
            run = numpy.frombuffer(data, dtype="<u2", count=2 * pairs, offset=at + 2)
            at += 2 + 4 * pairs
            lows = numpy.concatenate(
                [  # in int: a run ending at 65535 would wrap in uint16
                    numpy.arange(int(s), int(s) + int(n) + 1)
                    for s, n in zip(run[::2], run[1::2], strict=True)
                ]
            )
        elif cardinality > _ARRAY_MAX:
            bits = numpy.frombuffer(data, dtype=numpy.uint8, count=8192, offset=at)
            lows = numpy.flatnonzero(numpy.unpackbits(bits, bitorder="little"))
            at += 8192
        else:
            lows = numpy.frombuffer(data, dtype="<u2", count=cardinality, offset=at)
            at += 2 * cardinality
        found.append(lows.astype(numpy.uint32) | numpy.uint32(key << 16))
    return (numpy.concatenate(found) if found else numpy.zeros(0, dtype=numpy.uint32)), at


def stored_rows(
    table_dir: str | Path, descriptor: Mapping[str, Any], files: dict[Path, bytes] | None = None
) -> numpy.ndarray:
    """The row indexes the deletion vector `descriptor` (a file action's `deletionVector`)
    deletes, read from where it is stored: inline, or in a file beside the table's data
    (checked against its CRC-32). `files`: the vector files read already, by path, and where
    to keep those read now (one commit's vectors share one file)."""
    stored, where = descriptor["storageType"], descriptor["pathOrInlineDv"]
    size = int(descriptor["sizeInBytes"])
    if stored == "i":
        return deserialized(z85_decoded(where + "0" * (-len(where) % 5))[:size])
    if stored == "u":
        prefix, name = where[:-20], f"deletion_vector_{uuid.UUID(bytes=z85_decoded(where[-20:]))}"
        path = Path(table_dir) / prefix / f"{name}.bin"
    else:
        path = Path(unquote(urlparse(where).path))
    files = {} if files is None else files
    if path not in files:
        files[path] = path.read_bytes()
    at = int(descriptor.get("offset") or 1)
    (length,) = struct.unpack_from(">i", files[path], at)
    data = files[path][at + 4 : at + 4 + length]
    (crc,) = struct.unpack_from(">I", files[path], at + 4 + length)
    if length != size or zlib.crc32(data) != crc:
        raise ValueError(f"the deletion vector at {path} does not match its descriptor")
    return deserialized(data)


def _roaring32(rows: numpy.ndarray) -> bytes:
    """A 32-bit roaring bitmap (sorted unique `rows`) in portable serialization, without run
    containers."""
    highs, starts = numpy.unique(rows >> 16, return_index=True)
    ends = [*starts[1:], len(rows)]
    containers = []
    for start, end in zip(starts, ends, strict=True):
        lows = (rows[start:end] & 0xFFFF).astype("<u2")
        if len(lows) <= _ARRAY_MAX:
            containers.append(lows.tobytes())
        else:
            bits = numpy.zeros(1 << 16, dtype=bool)
            bits[lows] = True
            containers.append(numpy.packbits(bits, bitorder="little").tobytes())
    count = len(containers)
    header = struct.pack("<II", _NO_RUN_COOKIE, count)
    header += b"".join(
        struct.pack("<HH", int(high), int(end - start) - 1)
        for high, start, end in zip(highs, starts, ends, strict=True)
    )
    offset = len(header) + 4 * count
    for container in containers:
        header += struct.pack("<I", offset)
        offset += len(container)
    return header + b"".join(containers)


def z85(data: bytes) -> str:
    """`data` (a multiple of 4 bytes) in Z85, the encoding of a deletion vector's file id."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out: list[str] = []
    for at in range(0, len(data), 4):
        value = int.from_bytes(data[at : at + 4], "big")
        word: list[str] = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            word.append(_Z85[digit])
        out.extend(reversed(word))
    return "".join(out)


def z85_decoded(text: str) -> bytes:
    """The bytes `text` (a multiple of 5 characters) spells in Z85."""
    if len(text) % 5:
        raise ValueError("Z85 decodes whole 5-character words")
    out = b""
    for at in range(0, len(text), 5):
        value = 0
        for char in text[at : at + 5]:
            value = value * 85 + _Z85.index(char)
        out += value.to_bytes(4, "big")
    return out


class VectorFile:
    """The deletion vectors of one commit, stored in one file: `add` each, then write `data`
    to `name` at the table's root."""

    def __init__(self) -> None:
        self.id = uuid.uuid4()
        self.count = 0
        """The vectors added."""
        self._data = bytearray(b"\x01")  # the format's version
        self._spelled = z85(self.id.bytes)

    @property
    def name(self) -> str:
        return f"deletion_vector_{self.id}.bin"

    @property
    def data(self) -> bytes:
        return bytes(self._data)

    def add(self, rows: numpy.ndarray | Sequence[int]) -> dict[str, object]:
        """Store the vector of the deleted row indexes `rows` (at least one); its descriptor,
        the `deletionVector` of the file's add action."""
        rows = numpy.unique(numpy.asarray(rows, dtype=numpy.uint64))
        if not len(rows):
            raise ValueError("a deletion vector deletes at least one row")
        body = _serialized_unique(rows)
        offset = len(self._data)
        self.count += 1
        self._data += struct.pack(">i", len(body)) + body + struct.pack(">I", zlib.crc32(body))
        return {
            "storageType": "u",
            "pathOrInlineDv": self._spelled,
            "offset": offset,
            "sizeInBytes": len(body),
            "cardinality": len(rows),
        }
