"""The words check (`scripts/check_words.py`): notes on how the project was worked on are refused
in code, tests and docs, ordinary words that look like them pass, and the repository has none.

The examples of refused notes are assembled from parts, so this file does not hold them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_words.py"


def check_words() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_words", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def joined(*parts: str) -> str:
    return " ".join(parts)


REFUSED = [
    f"Latest figures, **{joined('session', '22')}** (two runs)",
    f"the race of {joined('issue', '13')}'s item 4",
    f"during a dump under writes ({joined('issue', '#28')})",
    f"See {joined('Issue', '#7')} for why",
    f"From {joined('round', '3')} on, the reader wakes",
    f"measured {joined('two', 'rounds', 'ago')}",
    f"bench: {joined('the', 'issue' + chr(39) + 's', 'goal')} is 0.9",
    f"on a machine {joined('other', 'engineers' + chr(39))} tests loaded",
    f"while {joined('another', 'agent' + chr(39) + 's')} tests ran",
    f"## {joined('Amendment', '(2026-11)')}",
    f"## {joined('2026-11-23:', 'the fold')}",
    f"- {joined('work', 'log:')} tried the decimal",
]

PASSED = [
    "each question is a round trip the log's reading waits for",
    "Strict mode still rounds 1.5 into an int",
    "rounding 2.5 to 2",
    "Which errors mean this session is gone",
    "the server shows it to other sessions",
    "issue a statement, then read its result",
    "a round of 20 walsenders ended",
    "issues 3 statements a chunk",
    "apache/arrow#45284: no row ranges yet",
    "the window's round trips: 2",
]


@pytest.mark.parametrize("line", REFUSED)
def test_a_note_on_how_the_work_went_is_refused(line: str) -> None:
    found = check_words().findings(Path("doc.md"), f"ok\n{line}\n")
    assert found and found[0].startswith("doc.md:2: "), found


@pytest.mark.parametrize("line", PASSED)
def test_ordinary_words_pass(line: str) -> None:
    assert check_words().findings(Path("doc.md"), line) == []


def test_a_numbered_session_is_refused_whatever_it_meant() -> None:
    """A number after "session" reads as a work session: the code says "the first session"."""
    assert check_words().findings(Path("x.py"), joined("the tailer's", "session", "1", "of it"))


def test_the_repository_has_no_notes_on_how_the_work_went() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_named_files_are_checked_and_their_findings_printed(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"fine\n{REFUSED[0]}\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(doc)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert done.stdout.startswith(f"{doc}:2: a numbered work round, session or issue")
