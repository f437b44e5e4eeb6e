"""The NDJSON output when its writer is frozen in the middle of a batch (SIGSTOP, as a paused
VM looks): a writer with a newer token takes the directory over at once, without waiting for
the frozen one, and once that one wakes none of its lines shows after the new writer's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_dblog.outputs import NdjsonOutput, read_events
from tests.integration.e2e_support import REPO, wait_until
from tests.integration.outputs.ndjson_writer import BATCH, MAX_BYTES, event

pytestmark = pytest.mark.integration
LEASE_TTL_S = 3.0
"""A tailer's lease: the new writer's first batch must land well within it."""


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_writer_frozen_mid_batch_is_taken_over_at_once_and_writes_nothing_after(
    tmp_path: Path, when: str
) -> None:
    """The old writer (token 5) stops itself in its third batch, before its first write or
    between that write and its fsync; files are a few batches' lines, so its batch also needs
    a new file. The new writer (token 7, the lock wait a tailer uses) replays from commit 1 and
    goes on; then the old one wakes and every batch it has left is refused."""
    directory = tmp_path / "events"
    argv = [str(directory), "5", "5", "2", when]  # token, batches, the one it stops in
    old = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.outputs.ndjson_writer", *argv],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert old.stdout is not None
        assert [old.stdout.readline() for _ in range(3)] == ["wrote 0\n", "wrote 1\n", "stopping\n"]
        wait_until(lambda: process_state(old.pid) == "T", 30, "the old writer stopped")
        with NdjsonOutput(directory, max_bytes=MAX_BYTES, lock_timeout_s=LEASE_TTL_S / 4) as new:
            started = time.monotonic()
            new.write([event(c, "new") for c in range(1, 4 * BATCH + 1)], 7)
            took = time.monotonic() - started
            assert took < LEASE_TTL_S, f"the takeover took {took:.1f}s"
            old.send_signal(signal.SIGCONT)
            rest, _ = old.communicate(timeout=60)
            assert rest.splitlines() == ["fenced 2", "fenced 3", "fenced 4"]
            new.write([event(c, "new") for c in range(4 * BATCH + 1, 6 * BATCH + 1)], 7)
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
            old.wait()
    events = list(read_events(directory))
    assert [e.position.commit for e in events] == list(range(1, 6 * BATCH + 1))
    names = [e.after["name"] if e.after else None for e in events]
    first_new = names.index("new")
    assert first_new >= 2 * BATCH, "the old writer's whole batches are kept"
    assert set(names[first_new:]) == {"new"}, "no line of the old writer after the new one's"
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".events")]
