"""A verify run has one runner at a time: its claim in the store (`VerifyStore.claim`), and
`verify.runner.running`, which holds it while a run runs, on a real Redis."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_dblog.dump.runner import process_name
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.verify.runner import RunInProgress, running
from tests.integration.state.support import wait_for

pytestmark = pytest.mark.integration


def test_a_run_is_claimed_by_one_owner_until_released_or_expired(store: StateStore) -> None:
    assert store.verifies.claim("v1", "host:1", 60_000) is None
    assert store.verifies.claim("v1", "host:1", 60_000) is None  # renewed
    assert store.verifies.claim("v1", "host:2", 60_000) == "host:1"
    assert store.verifies.runner("v1") == "host:1"
    assert store.verifies.claim("v1", "host:2", 60_000, gone="host:9") == "host:1"
    assert store.verifies.claim("v1", "host:2", 60_000, gone="host:1") is None  # taken over
    assert store.verifies.runner("v1") == "host:2"

    store.verifies.release("v1", "host:1")  # not its claim any more: left alone
    assert store.verifies.runner("v1") == "host:2"
    store.verifies.release("v1", "host:2")
    assert store.verifies.runner("v1") is None

    assert store.verifies.claim("v2", "host:3", 200) is None
    assert store.verifies.runner("v1") is None, "a claim is per run"
    wait_for(lambda: store.verifies.runner("v2") is None, 5, "the claim expiring")
    assert store.verifies.claim("v2", "host:4", 60_000) is None


def test_running_refuses_a_live_runner_and_takes_over_a_dead_one(store: StateStore) -> None:
    store.verifies.claim("v1", "elsewhere:1", 60_000)  # another host's process: taken as alive
    with (
        pytest.raises(RunInProgress, match="verify v1 is running in elsewhere:1"),
        running(store, "v1"),
    ):
        pytest.fail("a second runner ran")
    assert store.verifies.runner("v1") == "elsewhere:1"

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    gone = f"{process_name().rpartition(':')[0]}:{dead.stdout.strip()}"
    store.verifies.claim("v2", gone, 60_000)  # a process of this host, killed a moment ago
    with running(store, "v2") as still_ours:
        assert store.verifies.runner("v2") == process_name()
        still_ours()
        assert store.verifies.claim("v2", gone, 60_000) == process_name()
    assert store.verifies.runner("v2") is None, "released when the run ends"


def test_a_runner_whose_run_was_taken_over_is_told_between_chunks(store: StateStore) -> None:
    with running(store, "v1") as still_ours:
        store.verifies.release("v1", process_name())  # as if its claim expired,
        store.verifies.claim("v1", "elsewhere:2", 60_000)  # and another process claimed it

        def told() -> bool:
            try:
                still_ours()
            except RunInProgress as exc:
                assert "taken over by elsewhere:2" in str(exc)
                return True
            return False

        wait_for(told, 10, "the renewal seeing the run taken over")
    assert store.verifies.runner("v1") == "elsewhere:2", "another's claim is left alone"
