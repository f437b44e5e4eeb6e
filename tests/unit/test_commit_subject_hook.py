"""The commit-msg hook (`scripts/check_commit_subject.py`): a subject over 72 characters is
refused, as pre-commit runs it from `.pre-commit-config.yaml` in a repository of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_commit_subject.py"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("message", "allowed"),
    [
        ("x" * 72 + "\n\nA body line may be as long as it likes " + "y" * 80 + "\n", True),
        ("x" * 73 + "\n", False),
        ("é" * 72 + "\n", True),  # characters, not bytes
        ("# Please enter the commit message\n\n" + "x" * 73 + "\n", False),
        ("# a comment longer than the limit " + "#" * 80 + "\nShort subject\n", True),
        ("Short subject   \n", True),
    ],
)
def test_a_subject_over_72_characters_is_refused(
    tmp_path: Path, message: str, allowed: bool
) -> None:
    done = check(tmp_path, message)
    assert done.returncode == (0 if allowed else 1), done.stderr
    if not allowed:
        assert "73 characters, at most 72" in done.stderr


def test_pre_commit_runs_it_at_the_commit_msg_stage_only(tmp_path: Path) -> None:
    """In a throwaway repository holding the project's config and script: pre-commit runs the
    hook on the message file and refuses a long subject; the file checks stay at pre-commit."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / ".pre-commit-config.yaml", repo)
    shutil.copy(SCRIPT, repo / "scripts")
    (repo / ".venv").symlink_to(REPO / ".venv")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    run("git", "init", "-q")
    run("git", "add", ".pre-commit-config.yaml", "scripts")
    pre_commit = str(REPO / ".venv" / "bin" / "pre-commit")
    for subject, code in (("x" * 73, 1), ("x" * 72, 0)):
        (tmp_path / "msg").write_text(subject + "\n")
        done = run(
            pre_commit,
            "run",
            "--hook-stage",
            "commit-msg",
            "--commit-msg-filename",
            str(tmp_path / "msg"),
        )
        assert done.returncode == code, done.stdout + done.stderr
        assert "commit subject at most 72 characters" in done.stdout
        assert "ruff" not in done.stdout and "mypy" not in done.stdout
