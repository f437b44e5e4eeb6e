"""`dblog demo --redis-ha`: the demo on a Sentinel group whose primary is killed after the full
dump; the repair and the tailer go on with the promoted replica and the target equals the
source."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.cli import main

pytestmark = pytest.mark.integration


def test_the_demo_runs_on_a_sentinel_group_through_a_failover(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["demo", "--redis-ha", "--rows", "100", "--write-seconds", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "a Redis Sentinel group (primary, replica, 3 sentinels)" in out
    assert "Sentinel promotes the replica" in out
    assert "go on with the new primary, service dblog (sentinels 127.0.0.1:" in out
    assert "target == source" in out and "20 keys repaired" in out
