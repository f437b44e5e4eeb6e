"""How long the log reader lets a busy stream's frames gather before it reads them."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.sources.postgres.replication import gathering_s

pytestmark = pytest.mark.unit


def test_a_heavy_stream_that_keeps_up_gathers_longest() -> None:
    light = gathering_s(3, False, 60.0)
    heavy = gathering_s(500, False, 60.0)
    assert light < heavy
    assert gathering_s(500, True, 60.0) < heavy  # behind: the server must not stall on it


def test_a_dumps_watermarks_shorten_the_gathering_for_a_while() -> None:
    heavy = gathering_s(500, False, 60.0)
    dumping = gathering_s(500, False, 0.1)
    assert 0 < dumping < heavy  # each chunk waits for its low and its high watermark
    assert gathering_s(500, False, 5.0) == heavy  # the dump ended a while ago
    assert gathering_s(3, False, 0.1) == gathering_s(3, False, 60.0)
