"""A commit-msg hook: refuse a commit whose subject line is longer than 72 characters.

The subject is the first line of the message that is not a comment (git drops lines starting
with `#`). 72 characters is what `git log --oneline`, patch e-mails and most tools show
without cutting. Used by `.pre-commit-config.yaml` (`pre-commit install` sets it up);
`python scripts/check_commit_subject.py MESSAGE_FILE` checks a message by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 72


def subject(message: str) -> str:
    """The message's subject: its first line that is neither empty nor a comment."""
    for line in message.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.rstrip()
    return ""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} MESSAGE_FILE", file=sys.stderr)
        return 2
    line = subject(Path(argv[1]).read_text(encoding="utf-8"))
    if len(line) > LIMIT:
        print(
            f"commit subject is {len(line)} characters, at most {LIMIT} are allowed: "
            f"shorten it and put the rest in the body\n  {line}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
