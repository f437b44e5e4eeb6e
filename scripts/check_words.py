"""Refuse notes on how the project was worked on, in its code, tests and docs.

The files say what the code does now and why; how it got there (numbered work rounds, sessions
or issues, dated amendments, who else was loading the machine) belongs in git's history, where
it cannot go stale. Ordinary words pass: a round trip, rounding, a database session, to issue a
statement.

    python scripts/check_words.py [PATH ...]

Without paths it reads every text file git tracks or would track (untracked files that are not
ignored too). Exit status 1, with a line per finding (`path:line: what: the words`), if any.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RULES = [
    (
        re.compile(
            r"\b(?:rounds?|sessions?|issue|iterations?|sprints?)\s+(?:no\.\s*)?#?\d+(?![.,]?\d)",
            re.I,
        ),
        "a numbered work round, session or issue",
    ),
    (re.compile(r"\bissue\s*#\s*\d+", re.I), "an issue number"),
    (re.compile(r"\b(?:rounds?|sessions?|iterations?)\s+ago\b", re.I), "a work round in time"),
    (
        re.compile(r"\b(?:the|an?)\s+(?:issue|round|session)'s\s+(?:goal|item|ask)s?\b", re.I),
        "what a work item asked",
    ),
    (
        re.compile(
            r"\b(?:other|another)\s+(?:engineer|agent|helper|contributor)s?(?:'s?)?\s", re.I
        ),
        "who else was working",
    ),
    (re.compile(r"\bwork[- ]?log\b", re.I), "a diary of the work"),
    (re.compile(r"\bamendment\s*\(", re.I), "a dated amendment"),
    (re.compile(r"^\s*#+\s.*\b20\d\d-[01]\d\b"), "a dated heading"),
]
"""(pattern, what it finds): each matched against one line at a time. "issues" with a number is
left out: it is the verb ("issues 3 statements")."""

TEXT_SUFFIXES = {
    ".py",
    ".md",
    ".sh",
    ".toml",
    ".yaml",
    ".yml",
    ".txt",
    ".cfg",
    ".ini",
    ".html",
    ".js",
    ".css",
    ".sql",
    ".conf",
    ".json",
    ".env",
}
TEXT_NAMES = {"run", "Dockerfile", "Makefile"}


def findings(path: Path, text: str) -> list[str]:
    """`path:line: what: the line` for every rule a line of `text` breaks."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in RULES:
            match = pattern.search(line)
            if match:
                found.append(f"{path}:{number}: {what}: {match.group(0).strip()!r}")
    return found


def project_files() -> list[Path]:
    """The text files git tracks, and those it would track (not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    paths = [Path(p) for p in listed.split("\0") if p]
    return [
        p
        for p in paths
        if (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES) and (REPO / p).is_file()
    ]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] if argv else project_files()
    found = []
    for path in paths:
        full = path if path.is_absolute() else REPO / path
        found += findings(path, full.read_text(encoding="utf-8", errors="replace"))
    for line in found:
        print(line)
    if found:
        print(
            f"check_words: {len(found)} notes on how the work went; say what the code does, "
            "and leave the history to git",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
