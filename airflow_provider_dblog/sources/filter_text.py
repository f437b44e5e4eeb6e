"""The first check of a dump's filter (`DumpRequest.where`), before the server judges it: the
text must be one condition that stays inside the parentheses the chunk query puts around it.

The chunk query is `... WHERE <key range> AND (<filter>) ORDER BY <key>`; a filter that closed
that parenthesis could append a UNION, an ORDER BY or a LIMIT, end the statement with `;`, or
comment out the rest. So outside quoted text and quoted names the filter may hold no `;`, no
comment, no parenthesis it does not close, and no subquery (`SELECT`: a filter is on the
table's own columns); each dialect's quoting is scanned as its server reads it. The server
then plans the query (`ChunkSource.check_filter`): columns, types, other tables, functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_provider_dblog.core.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class FilterSyntax:
    """How a dialect quotes: which characters open quoted text or a quoted name, and the
    constructs only some dialects have."""

    quotes: str
    """Characters that open a quoted span closed by the same character (doubled inside)."""
    backslash_escapes: bool = False
    """A backslash escapes the next character in quoted text (MySQL, unless its sql_mode has
    NO_BACKSLASH_ESCAPES)."""
    hash_comments: bool = False
    """`#` starts a comment (MySQL)."""
    dollar_quotes: bool = False
    """`$tag$ ... $tag$` quotes text (PostgreSQL); `E'...'` takes backslash escapes."""
    assignment: bool = False
    """`:=` assigns a user variable (MySQL): a side effect, refused."""


POSTGRES = FilterSyntax(quotes="'\"", dollar_quotes=True)
MYSQL = FilterSyntax(quotes="'\"`", backslash_escapes=True, hash_comments=True, assignment=True)

_KEYWORDS = frozenset(
    ("all", "and", "any", "array", "between", "case", "else", "escape", "exists", "ilike", "in",
     "interval", "is", "like", "not", "or", "row", "similar", "some", "then", "when")
)  # fmt: skip
"""Words a parenthesis may follow that are not function calls."""
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def scan_filter(text: str, syntax: FilterSyntax) -> frozenset[str]:
    """Check `text` as one condition (see the module's docstring); the names it calls as
    functions (lower case, unquoted names followed by `(`), for the dialect to judge. Raises
    `InvalidRequest` naming what is wrong."""
    if not text.strip():
        raise InvalidRequest("the filter is empty: give a condition on the table's columns")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        raise InvalidRequest("the filter holds a control character (a NUL, ...): remove it")
    calls: set[str] = set()
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in syntax.quotes:
            i = _closing(text, i, c, syntax.backslash_escapes and c != "`")
        elif syntax.dollar_quotes and c == "$" and (found := _DOLLAR.match(text, i)):
            end = text.find(found.group(0), found.end())
            if end < 0:
                raise InvalidRequest(f"the filter has an unterminated {found.group(0)} string")
            i = end + len(found.group(0))
        elif (
            text.startswith("--", i)
            or text.startswith("/*", i)
            or (syntax.hash_comments and c == "#")
        ):
            raise InvalidRequest("the filter may hold no comment (--, /* */, #)")
        elif c == ";":
            raise InvalidRequest("the filter must be one condition: it may hold no ';'")
        elif syntax.assignment and text.startswith(":=", i):
            raise InvalidRequest("the filter may assign no variable (:=)")
        elif c == "(":
            depth, i = depth + 1, i + 1
        elif c == ")":
            if depth == 0:
                raise InvalidRequest("the filter closes a parenthesis it did not open")
            depth, i = depth - 1, i + 1
        elif word := _WORD.match(text, i):
            i = word.end()
            name = word.group(0).lower()
            if name == "select":
                raise InvalidRequest(
                    "the filter may hold no subquery: it is a condition on the table's own columns"
                )
            if name in ("e", "x", "b", "n") and i < n and text[i] == "'" and syntax.dollar_quotes:
                i = _closing(text, i, "'", backslash=name == "e")  # E'..': escapes
                continue
            if name not in _KEYWORDS and text[i:].lstrip().startswith("("):
                calls.add(name)
        else:
            i += 1
    if depth:
        raise InvalidRequest("the filter leaves a parenthesis open")
    return frozenset(calls)


def _closing(text: str, start: int, quote: str, backslash: bool) -> int:
    """The index just past the quoted span opened at `start`."""
    i = start + 1
    while i < len(text):
        c = text[i]
        if backslash and c == "\\":
            i += 2
            continue
        if c == quote:
            if text.startswith(quote, i + 1):  # a doubled quote stands for itself
                i += 2
                continue
            return i + 1
        i += 1
    raise InvalidRequest(f"the filter has an unterminated {quote}...{quote}")
