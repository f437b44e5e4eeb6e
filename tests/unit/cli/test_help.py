"""`dblog --help` and each command's help, as a user reads them: the tool described in its
own terms (not its code), and every option explained."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from airflow_provider_dblog.cli import build_parser

pytestmark = pytest.mark.unit


def options(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.Action]]:
    """(command, option) for every option of every command under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from options(sub, f"{name} {command}")
        elif action.option_strings:
            yield name, action


def test_the_top_help_describes_the_tool_not_the_code() -> None:
    text = build_parser().format_help()
    assert "Change data capture for PostgreSQL and MySQL/MariaDB" in text
    assert "`dblog tail` follows the database's log" in text
    assert "dblog COMMAND --help" in text
    assert "module" not in text and "register(" not in text


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{c} {a.option_strings[0]}" for c, a in options(build_parser(), "dblog") if not a.help
    ]
    assert missing == []
    dump = next(
        a.choices["dump"]
        for a in build_parser()._actions
        if isinstance(a, argparse._SubParsersAction)
    )
    text = dump.format_help()
    assert "chunks read at once" in text and "waits for the tailer" in text
