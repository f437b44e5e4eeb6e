"""A running Airflow for the tests: api-server, scheduler (LocalExecutor), dag-processor and
triggerer as four child processes on a private AIRFLOW_HOME (sqlite) and free loopback ports,
and a small client of its REST API.

Each component runs in its own session (process group) and writes its own log file under
AIRFLOW_HOME, so a failing test can show what a component said; stopping kills each group
(SIGTERM, then SIGKILL after a grace period), task processes included. The API user and its
password are made here: the password is written to the simple auth manager's passwords file
(mode 0600) and never appears on a command line.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from airflow_provider_dblog.devservices.process import free_port
from tests.deadlines import deadline_s
from tests.integration.airflow_support import BIN, migrate

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "dblog-tester"
FINISHED = {"success", "failed"}
TASK_FAILED = {"failed", "up_for_retry", "upstream_failed"}
LOG_NOISE = (
    *("logger", "loc", "sources", "filename", "lineno", "ti_id", "map_index"),
    *("dag_id", "run_id", "task_id", "try_number"),
)


def server_env(base: dict[str, str], home: Path, port: int) -> dict[str, str]:
    """`base` (from `airflow_support.airflow_env`) plus what a multi-process Airflow on
    loopback needs: its ports, one JWT secret shared by the components, the API user."""
    env = dict(base)
    url = f"http://127.0.0.1:{port}"
    env.update(
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__AUTH_MANAGER=(
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USER}:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "api-passwords.json"),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{url}/execution/",
        AIRFLOW__API__BASE_URL=url,
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_urlsafe(32),
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="1",
        AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK="False",
    )
    return env


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5
) -> Any:
    """Poll `condition` until it returns something true, and return that."""
    deadline = time.monotonic() + deadline_s(timeout_s)
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s(timeout_s)}s")
        time.sleep(every_s)


@dataclass
class AirflowServer:
    home: Path
    env: dict[str, str]
    url: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    client: httpx.Client | None = None

    # -- processes -----------------------------------------------------------------------------

    def log_of(self, component: str) -> Path:
        return self.home / f"{component}.out"

    def start(self) -> None:
        for component in COMPONENTS:
            self.start_component(component)

    def start_component(self, component: str) -> None:
        with self.log_of(component).open("ab") as out:
            self.processes[component] = subprocess.Popen(
                [str(BIN / "airflow"), component],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_component(self, component: str) -> None:
        """SIGKILL one component's whole group, as a crash or an OOM kill would stop it."""
        process = self.processes[component]
        _signal_group(process, signal.SIGKILL)
        process.wait(30)

    def check_alive(self) -> None:
        for component, process in self.processes.items():
            if process.poll() is not None:
                raise AssertionError(
                    f"airflow {component} exited with {process.returncode}:\n"
                    + self.tail(component)
                )

    def tail(self, component: str, chars: int = 4000) -> str:
        path = self.log_of(component)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, grace_s: float = 10) -> None:
        if self.client is not None:
            self.client.close()
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self.processes.values():
            with suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        # Whatever is left in a group (the process itself, executor workers, task processes).
        for process in self.processes.values():
            _signal_group(process, signal.SIGKILL)
            if process.poll() is None:
                process.wait(10)

    # -- the REST API ----------------------------------------------------------------------------

    def healthy(self) -> bool:
        self.check_alive()
        try:
            answer = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5)
        except httpx.TransportError:
            return False
        if answer.status_code != 200:
            return False
        health = answer.json()
        return all(
            (health.get(part) or {}).get("status") == "healthy"
            for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
        )

    def login(self) -> None:
        passwords = json.loads(
            Path(self.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text()
        )
        answer = httpx.post(
            f"{self.url}/auth/token",
            json={"username": USER, "password": passwords[USER]},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        token = answer.json()["access_token"]
        # A loaded api-server can take long over one answer: a generous read timeout.
        self.client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(120, connect=30),
        )

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self.client is not None, "login() first"
        answer = self.client.request(method, path, **kwargs)
        assert answer.is_success, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def wait_dag(self, dag_id: str, timeout_s: float = 90) -> dict[str, Any]:
        """The DAG, once the dag-processor has parsed it (fails on an import error)."""

        def parsed() -> dict[str, Any] | None:
            self.check_alive()
            errors = self.api("GET", "/api/v2/importErrors")["import_errors"]
            assert not errors, errors
            assert self.client is not None
            answer = self.client.get(f"/api/v2/dags/{dag_id}")
            return answer.json() if answer.status_code == 200 else None

        found: dict[str, Any] = wait_for(parsed, timeout_s, f"DAG {dag_id} parsed")
        return found

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """Unpause the DAG and start a run with `conf`, as the UI's trigger form does."""
        self.api("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
        run = self.api(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        run_id: str = run["dag_run_id"]
        return run_id

    def run_state(self, dag_id: str, run_id: str) -> str:
        state: str = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
        return state

    def wait_run(
        self, dag_id: str, run_id: str, timeout_s: float, *, fail_fast: bool = False
    ) -> str:
        """The run's final state ("success" or "failed"); with `fail_fast`, "failed" as soon as
        a task fails or waits for a retry, without waiting for retries or the rest."""

        def finished() -> str | None:
            self.check_alive()
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                return state
            if fail_fast and set(self.task_states(dag_id, run_id).values()) & TASK_FAILED:
                return "failed"
            return None

        state: str = wait_for(finished, timeout_s, f"run {run_id} of {dag_id} finishing")
        return state

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
        )["task_instances"]
        return found

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        entry = self.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": "true"},
        )
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) else value

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        assert self.client is not None
        answer = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/x-ndjson"},
        )
        if not answer.is_success:
            return f"(no log: {answer.status_code} {answer.text})"
        return "\n".join(_log_line(line) for line in answer.text.splitlines() if line.strip())

    def report(self, dag_id: str, run_id: str) -> str:
        """The tasks' states and logs of a run, and the components' last output: the message
        of a failed assertion."""
        parts = [f"run {run_id} of {dag_id}: {self.run_state(dag_id, run_id)}"]
        for ti in self.task_instances(dag_id, run_id):
            parts.append(f"--- task {ti['task_id']}: {ti['state']} (try {ti['try_number']})")
            for attempt in range(1, (ti["try_number"] or 0) + 1):
                parts.append(self.task_log(dag_id, run_id, ti["task_id"], attempt)[-6000:])
        for component in ("scheduler", "triggerer"):
            parts.append(f"--- airflow {component} (end)\n{self.tail(component, 2000)}")
        return "\n".join(parts)


def _log_line(line: str) -> str:
    """One line of a task log as text: time, level, message, then its other fields."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    if not isinstance(entry, dict):
        return line
    head = [str(entry.pop(k, "")) for k in ("timestamp", "level", "event")]
    for noise in LOG_NOISE:
        entry.pop(noise, None)
    errors = entry.pop("error_detail", None)
    if isinstance(errors, list):  # the exceptions, without their frames
        head += [
            f"{e.get('exc_type')}: {e.get('exc_value')}" for e in errors if isinstance(e, dict)
        ]
    return " ".join(head) + (f" {json.dumps(entry, default=str)}" if entry else "")


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@contextmanager
def airflow_server(
    home: Path, base_env: dict[str, str], timeout_s: float = 120
) -> Iterator[AirflowServer]:
    """Airflow running in `home` with `base_env`, healthy and logged in; stopped at exit."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = server_env(base_env, home, port)
    passwords = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    passwords.touch(mode=0o600)
    passwords.write_text(json.dumps({USER: secrets.token_urlsafe(16)}))
    migrate(env)
    server = AirflowServer(home, env, f"http://127.0.0.1:{port}")
    try:
        server.start()
        wait_for(server.healthy, timeout_s, "Airflow healthy (api-server and its components)")
        server.login()
        yield server
    finally:
        server.stop()
