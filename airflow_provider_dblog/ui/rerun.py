"""Resume a failed or cancelled dump from the page: `dblog dump --dump-id ID --resume`, run
by `dblog ui` as a child process with the view's own config file and environment (the source's
password stays in the variable the config names, never on the command line).

The child is the dump's driver as if typed in a shell: it reopens the dump and runs it on from
its last completed chunk in the store, its progress shows on the page like any dump's, and it
goes on if the view stops. Its output goes to the view's stderr; why it failed goes to the
store, where the page reads it.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from http import HTTPStatus
from pathlib import Path

from airflow_provider_dblog.state import DumpState, DumpStore

log = logging.getLogger(__name__)

RESUMABLE = (DumpState.FAILED, DumpState.CANCELLED)


def resume_command(dump_id: str) -> str:
    """What the page names as the shell equivalent."""
    return f"dblog dump --dump-id {dump_id} --resume"


class Rerunner:
    """Starts `dblog dump --resume` runs of the config at `config_path`."""

    def __init__(self, config_path: str | Path) -> None:
        self._config = str(Path(config_path).resolve())
        self._lock = threading.Lock()
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        """The runs this view started, by dump: one at a time (two clicks start one run)."""

    def rerun(self, dumps: DumpStore, dump_id: str) -> tuple[int, str]:
        """Start the run if the dump is failed or cancelled and no process drives it: the
        HTTP status and the message to show."""
        status = dumps.status(dump_id)
        if status is None:
            return HTTPStatus.NOT_FOUND, f"no dump {dump_id}"
        if status.state not in RESUMABLE:
            return (
                HTTPStatus.CONFLICT,
                f"dump {dump_id} is {status.state}: only a failed or cancelled dump is run again",
            )
        driver = dumps.driver(dump_id)
        if driver is not None:
            return HTTPStatus.CONFLICT, f"dump {dump_id} is still driven by {driver}"
        with self._lock:
            child = self._children.get(dump_id)
            if child is not None and child.poll() is None:
                return HTTPStatus.CONFLICT, f"dump {dump_id} is being resumed (pid {child.pid})"
            self._children[dump_id] = self._start(dump_id)
        return HTTPStatus.OK, f"dump {dump_id}: {resume_command(dump_id)} started"

    def _start(self, dump_id: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "airflow_provider_dblog.cli", "dump"]
        command += ["--config", self._config, "--dump-id", dump_id, "--resume"]
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the view does not stop the dump
        )
        log.info("dump %s: %s started (pid %d)", dump_id, resume_command(dump_id), process.pid)
        threading.Thread(
            target=_reap, args=(process, dump_id), name=f"dblog-ui-rerun-{process.pid}", daemon=True
        ).start()
        return process


def _reap(process: subprocess.Popen[bytes], dump_id: str) -> None:
    """Collect the child's exit (no zombie left), and say how it ended."""
    code = process.wait()
    log.info("dump %s: its resumed run (pid %d) exited %d", dump_id, process.pid, code)
