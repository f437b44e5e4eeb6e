"""`Position.trusted`, the log readers' constructor, builds the position `Position` builds."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.core.position import Position

pytestmark = pytest.mark.unit

COMMITS = st.integers(0, 2**64 - 1)
SEQS = st.integers(0, 2**40)


@given(COMMITS, SEQS, COMMITS, SEQS)
def test_a_trusted_position_is_the_checked_one(
    commit: int, seq: int, other_commit: int, other_seq: int
) -> None:
    trusted, checked = Position.trusted(commit, seq), Position(commit, seq)
    other = Position(other_commit, other_seq)
    assert type(trusted) is Position
    assert trusted == checked and hash(trusted) == hash(checked) and repr(trusted) == repr(checked)
    assert (trusted < other) == (checked < other) and (other < trusted) == (other < checked)
    assert trusted.to_json() == [commit, seq]


def test_a_trusted_position_is_frozen() -> None:
    position = Position.trusted(5, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        position.seq = 4  # type: ignore[misc]
    assert position == Position(5, 3)
