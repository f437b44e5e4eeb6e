"""An NDJSON writer in its own process that stops itself (SIGSTOP) in the middle of a batch,
for the takeover tests.

    python -m tests.integration.outputs.ndjson_writer DIRECTORY TOKEN BATCHES STOP_AT WHEN

It writes BATCHES batches of `BATCH` events (commit 1 on, name "old") with lease token TOKEN and
files of `MAX_BYTES`. At batch STOP_AT it prints "stopping" and stops itself before its first
write (WHEN "before") or between that write and its fsync ("after"); once continued it goes on,
printing "wrote N" or "fenced N" per batch.
"""

from __future__ import annotations

import os
import signal
import sys

from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, SourceInfo
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs import NdjsonOutput, OutputFenced

BATCH = 50
MAX_BYTES = 8192


def event(commit: int, name: str) -> Event:
    source = SourceInfo("src", "db", "app", "users", Position(commit, 0), Origin.LOG)
    return PlainEvent(Op.UPDATE, {"id": commit}, None, {"id": commit, "name": name}, source, 1)


def main(directory: str, token: int, batches: int, stop_at: int, when: str) -> None:
    out = NdjsonOutput(directory, max_bytes=MAX_BYTES)
    real_write, real_fsync = os.write, os.fsync
    armed = False

    def stop() -> None:
        nonlocal armed
        armed = False
        print("stopping", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    def write(fd: int, data: bytes | memoryview) -> int:
        if armed and when == "before":
            stop()
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        if armed and when == "after":
            stop()
        real_fsync(fd)

    os.write, os.fsync = write, fsync  # type: ignore[assignment]
    for number in range(batches):
        armed = number == stop_at
        first = number * BATCH + 1
        try:
            out.write([event(c, "old") for c in range(first, first + BATCH)], token)
            print(f"wrote {number}", flush=True)
        except OutputFenced:
            print(f"fenced {number}", flush=True)
    out.close()


if __name__ == "__main__":
    directory, token, batches, stop_at, when = sys.argv[1:]
    main(directory, int(token), int(batches), int(stop_at), when)
