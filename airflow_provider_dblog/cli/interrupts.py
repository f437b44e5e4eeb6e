"""Ctrl-C (SIGINT) ends any `dblog` command with one line on stderr and exit status 130 (128 +
SIGINT, what a shell reports for a command it interrupted), never a traceback.

`main` sets the handler before it imports the commands, whose imports take seconds on a busy
machine. The first SIGINT raises `KeyboardInterrupt` in the main thread, so the command unwinds
as from any error: its `finally` blocks give back what it holds (a dump's heartbeat, its
connections), and what it stored stays resumable (a dump's progress moves only past completed
chunks, and its status stays running, so the same `--dump-id` runs on from there). Work in other
threads can hold the exit up (a chunk waiting for the tailer to close its window): `GRACE_S`
after the interrupt, or at a second one, the process ends at once, leaving what a killed process
leaves, which a resume takes as well. A command that stops on SIGINT by design (`dblog tail`)
sets its own handler once it runs and ends as it documents.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

INTERRUPTED = 128 + signal.SIGINT
GRACE_S = 5.0
"""How long an interrupted command may take to unwind before the process ends regardless."""


class Interrupt:
    """The line an interrupt ends the command with: the command, and how to resume its work."""

    def __init__(self) -> None:
        self.command = "dblog"
        self.resume: str | None = None
        self.happened = False
        self._said = threading.Lock()

    def line(self) -> str:
        resume = f"; resume with: {self.resume}" if self.resume else ""
        return f"{self.command}: interrupted{resume}"

    def end(self) -> int:
        """Say the line (once, whoever ends first) and give the exit status."""
        if self._said.acquire(blocking=False):
            print(self.line(), file=sys.stderr, flush=True)
        return INTERRUPTED

    def end_now(self) -> None:
        """End the process without waiting for its threads."""
        self.end()
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(INTERRUPTED)


_active: Interrupt | None = None


def resumable(command: str) -> None:
    """Name the command that resumes what this one does, for the line an interrupt ends it
    with (`dblog dump --dump-id ID` once the dump is stored)."""
    if _active is not None:
        _active.resume = command


@contextmanager
def handled() -> Iterator[Interrupt]:
    """SIGINT handled as the module says while the block runs: a `KeyboardInterrupt` escaping
    the block is the caller's to end with `Interrupt.end`. Only the main thread receives
    signals, and a SIGINT the process was started to ignore (a background job of a shell)
    stays ignored: then nothing is set."""
    global _active
    interrupt = Interrupt()
    previous = signal.getsignal(signal.SIGINT)
    if (
        threading.current_thread() is not threading.main_thread()
        or previous is signal.SIG_IGN
        or previous is None  # a handler set outside Python, which could not be put back
    ):
        yield interrupt
        return

    def first(_number: int, _frame: FrameType | None) -> None:
        interrupt.happened = True
        signal.signal(signal.SIGINT, lambda *_: interrupt.end_now())
        watchdog = threading.Timer(GRACE_S, interrupt.end_now)
        watchdog.daemon = True
        watchdog.start()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, first)
    _active = interrupt
    try:
        yield interrupt
    finally:
        _active = None
        if not interrupt.happened:  # else a second SIGINT, while Python exits, ends it at once
            signal.signal(signal.SIGINT, previous)
