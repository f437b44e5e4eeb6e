"""The PostgreSQL mapping's fast path: Python functions generated for one relation's columns.

A Relation message fixes a table's columns and their converters until the next one, and nearly
every message after it is an insert of that table. So the conversion of a tuple to a row, and the
reading of a row message's tuples straight from its bytes, are written out as straight-
line code for those columns and compiled once per Relation message (`changes._Table.of`), about
ten times faster than the general loop. The generated code names columns and converters only by
their index (`n0`, `p0`, ...), bound as globals of the function, so no name from the database is
ever part of the code. Everything here is pure: its results are checked against the general path
on bytes (tests/unit/sources/postgres/test_compiled_rows.py).
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_provider_dblog.core.event import JsonValue, Row
from airflow_provider_dblog.sources.postgres import pgoutput


def compile_row(
    names: tuple[str, ...], parsers: tuple[Callable[[str], JsonValue] | None, ...]
) -> Callable[[pgoutput.TupleData], Row]:
    """A function from a whole tuple (no unchanged TOAST value) to its row, as the loop of
    `changes._Table.row` builds it: one dict display with each column's conversion spelled
    out."""
    namespace: dict[str, object] = {}
    items = []
    for i, (name, parse) in enumerate(zip(names, parsers, strict=True)):
        namespace[f"n{i}"] = name
        if parse is None:
            items.append(f"n{i}: v{i}")
        else:
            namespace[f"p{i}"] = parse
            items.append(f"n{i}: None if v{i} is None else p{i}(v{i})")
    unpack = "".join(f"v{i}, " for i in range(len(names)))
    source = "def whole_row(values):\n"
    if names:
        source += f"    {unpack}= values\n"
    source += f"    return {{{', '.join(items)}}}\n"
    exec(compile(source, "<pgoutput row>", "exec"), namespace)
    function: Callable[[pgoutput.TupleData], Row] = namespace["whole_row"]  # type: ignore[assignment]
    return function


def compile_tuple(
    names: tuple[str, ...],
    parsers: tuple[Callable[[str], JsonValue] | None, ...],
    key_indexes: tuple[int, ...],
) -> Callable[[bytes, int], tuple[Row, Row, int] | None]:
    """A function from a message's bytes and the offset of a tuple in it (an Insert's new
    tuple, an Update's old and new ones, a Delete's old one) to the row and the key
    `changes._Table.row` and `changes._Table.key` give, and the offset where the tuple ends:
    the values are read, converted and put in the two dicts in one pass of straight-line code,
    with no message object or tuple of values in between.

    It returns None for anything but a whole tuple of text and null values (an unchanged TOAST
    value, a wrong column count, a tuple running past the message, a value its converter
    refuses): the caller then decodes the message the general way, which gives the row or
    raises the error as always. Integer columns are converted from the bytes (`int` reads
    ASCII digits from bytes as from text)."""
    count = len(names)
    namespace: dict[str, object] = {
        "COUNT": count.to_bytes(2, "big"),
        "U32": pgoutput.U32_AT,
        "TEXT": pgoutput.TEXT_KIND,
        "NULL": pgoutput.NULL_KIND,
    }
    lines = [
        "def read_tuple(d, p):",
        "    try:",
        "        if d[p : p + 2] != COUNT:",
        "            return None",
        "        p += 2",
    ]
    for i, (name, parse) in enumerate(zip(names, parsers, strict=True)):
        namespace[f"n{i}"] = name
        if parse is None:
            value = "d[s:p].decode()"
        elif parse is int:
            value = "int(d[s:p])"
        else:
            namespace[f"p{i}"] = parse
            value = f"p{i}(d[s:p].decode())"
        lines += [
            "        k = d[p]",
            "        if k == TEXT:",
            "            (n,) = U32(d, p + 1)",
            "            s = p + 5",
            "            p = s + n",
            f"            v{i} = {value}",
            "        elif k == NULL:",
            f"            v{i} = None",
            "            p += 1",
            "        else:",
            "            return None",
        ]
    row = ", ".join(f"n{i}: v{i}" for i in range(count))
    key = ", ".join(f"n{i}: v{i}" for i in key_indexes)
    lines += [
        "        if p > len(d):",
        "            return None",
        "    except Exception:",
        "        return None",
        f"    return {{{row}}}, {{{key}}}, p",
    ]
    exec(compile("\n".join(lines) + "\n", "<pgoutput tuple>", "exec"), namespace)
    function: Callable[[bytes, int], tuple[Row, Row, int] | None] = namespace["read_tuple"]  # type: ignore[assignment]
    return function
