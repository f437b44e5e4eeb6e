"""Starting the dump's Spark application, attached or detached, and stopping it; the verify's
spark-submit command (`verify_command`: the verify operator starts and watches it).

The applications are `spark_jobs/dump.py` and `spark_jobs/verify.py`, found by import (the
`spark_jobs` package ships in the same wheel as this one). spark-submit's command comes from
the Spark provider's `SparkSubmitHook`, so the Spark connection's master, deploy mode and
binary apply as they do to `SparkSubmitOperator`. Passwords reach the application only as
environment variables named by the deployment's configuration (`DBLogHook.secret_env`),
inherited by spark-submit: never argv, never Spark properties, which the Spark UI shows.

The provider has no public way to build spark-submit's command without running it, or to
reach the process it started; this module is the one place that uses those private members
(`_build_spark_submit_command`, `_submit_sp`), each where it is needed and saying why, so that
a provider upgrade that changes them breaks here and nowhere else.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

import psutil
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.spark_package import package_zip

log = logging.getLogger(__name__)


def dump_application() -> str:
    """The path of `spark_jobs/dump.py` where it is installed (a wheel, or this source tree)."""
    return _application("spark_jobs.dump")


def verify_application() -> str:
    """The path of `spark_jobs/verify.py`, as `dump_application`."""
    return _application("spark_jobs.verify")


def _application(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise DBLogError("the spark_jobs package is not installed beside airflow_provider_dblog")
    return spec.origin


def submit_hook(
    hook: DBLogHook,
    spark_conn_id: str,
    application_args: list[str],
    *,
    name: str,
    spark_conf: dict[str, Any],
) -> SparkSubmitHook:
    """The Spark provider's hook for one of the applications; building it reads the Spark
    connection and puts the secrets and the driver's Python spark-submit needs into this
    process's environment."""
    hook.export_secrets()
    # A client-mode driver runs the Python that runs Airflow (it has this package) unless
    # the deployment says otherwise; the driver then runs its executors' Python workers on
    # its own interpreter unless `spark.pyspark.python` names theirs
    # (`spark_package.use_driver_python`), whatever the master.
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return SparkSubmitHook(
        conn_id=spark_conn_id,
        conf=spark_conf,
        application_args=application_args,
        # The package goes with the application: to the executors, and to the driver
        # when it runs on the cluster (deploy mode cluster).
        py_files=str(package_zip()),
        name=name,
    )


def submit_command(spark: SparkSubmitHook, application: str) -> list[str]:
    """spark-submit's command line for `application`, as the Spark provider builds it."""
    # Private: `_build_spark_submit_command` is the only way to get the command without
    # running it; the public `submit()` runs it and waits, and a deferring task must not.
    command: list[str] = spark._build_spark_submit_command(application)
    return command


def verify_command(
    hook: DBLogHook,
    spark_conn_id: str,
    verify_id: str,
    *,
    window_timeout_s: float,
    tasks_per_chunk: int | None = None,
    spark_conf: dict[str, Any] | None = None,
) -> list[str]:
    """spark-submit's command running the stored verify run `verify_id` on Spark (its
    configuration passed as the dump's is: no password)."""
    args = ["--verify-id", verify_id, *_config_args(hook)]
    args += ["--window-timeout", str(window_timeout_s)]
    if tasks_per_chunk:
        args += ["--tasks", str(tasks_per_chunk)]
    name = f"dblog-verify-{verify_id}"
    spark = submit_hook(hook, spark_conn_id, args, name=name, spark_conf=dict(spark_conf or {}))
    return submit_command(spark, verify_application())


def _config_args(hook: DBLogHook) -> list[str]:
    """The configuration as the applications take it: its TOML's path, or the connection's
    sections as JSON (they hold no password)."""
    settings = hook.settings
    if settings.config_path is not None:
        return ["--config", settings.config_path]
    return ["--config-json", json.dumps(settings.config_data)]


def driver_log_path(dump_id: str) -> Path:
    """Where a detached spark-submit writes its output (the driver's log in client mode)."""
    return Path(tempfile.gettempdir()) / f"dblog-spark-{dump_id}.log"


def driver_log_tail(dump_id: str, lines: int = 40) -> str | None:
    """The last `lines` lines of a detached driver's log (its last 64 KiB at most); None when
    the log is not on this machine (the dump was started on another worker)."""
    try:
        with driver_log_path(dump_id).open("rb") as driver_log:
            driver_log.seek(0, os.SEEK_END)
            driver_log.seek(max(0, driver_log.tell() - _TAIL_BYTES))
            data = driver_log.read()
    except OSError:
        return None
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


_TAIL_BYTES = 64 << 10


class SparkDumpLauncher:
    """Runs one dump as a Spark application and stops it.

    `run()` waits for spark-submit in this process; `launch_detached()` starts it in its own
    session, outliving a task process that defers; `kill()` cancels the dump and kills
    spark-submit with all its descendants.

    :param hook: the dblog hook of the dump's deployment (its configuration and secrets).
    :param spark_conn_id: the Spark connection (master, deploy mode, spark-submit binary).
    :param dump_id: the stored dump request to run.
    :param window_timeout_s: how long a chunk waits for the tailer before it is retried.
    :param source_patience_s: how long the dump waits for a source (or Redis) that went away,
        per outage, before it fails.
    :param tasks_per_chunk: Spark tasks that read one chunk (default: Spark's parallelism).
    :param spark_conf: extra Spark properties (never secrets: the UI shows them).
    """

    def __init__(
        self,
        hook: DBLogHook,
        spark_conn_id: str,
        dump_id: str,
        *,
        window_timeout_s: float = 60.0,
        source_patience_s: float = SOURCE_PATIENCE_S,
        tasks_per_chunk: int | None = None,
        spark_conf: dict[str, Any] | None = None,
    ) -> None:
        self.hook = hook
        self.spark_conn_id = spark_conn_id
        self.dump_id = dump_id
        self.window_timeout_s = window_timeout_s
        self.source_patience_s = source_patience_s
        self.tasks_per_chunk = tasks_per_chunk
        self.spark_conf = dict(spark_conf or {})
        self._detached: subprocess.Popen[bytes] | None = None

    def application_args(self) -> list[str]:
        """The dump application's arguments: ids, numbers and the configuration (its TOML's
        path, or the connection's sections as JSON: they hold no password)."""
        args = [
            "--dump-id",
            self.dump_id,
            *_config_args(self.hook),
            "--window-timeout",
            str(self.window_timeout_s),
            "--source-patience",
            str(self.source_patience_s),
        ]
        if self.tasks_per_chunk:
            args += ["--tasks", str(self.tasks_per_chunk)]
        return args

    @cached_property
    def spark(self) -> SparkSubmitHook:
        """The Spark provider's hook for this dump (`submit_hook`)."""
        return submit_hook(
            self.hook,
            self.spark_conn_id,
            self.application_args(),
            name=f"dblog-dump-{self.dump_id}",
            spark_conf=self.spark_conf,
        )

    def command(self) -> list[str]:
        """spark-submit's command line, as the Spark provider builds it."""
        return submit_command(self.spark, dump_application())

    def run(self) -> None:
        """spark-submit in this process, its output in the task log, until it exits.
        Raises the provider's `AirflowException` if spark-submit fails."""
        self.spark.submit(dump_application())

    def launch_detached(self) -> int:
        """spark-submit in its own session, outliving this process (a task ends when it
        defers); its output goes to `driver_log_path`. Returns its pid."""
        path = driver_log_path(self.dump_id)
        with path.open("ab") as driver_log:
            self._detached = subprocess.Popen(
                self.command(),
                stdout=driver_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        log.info(
            "dump %s submitted (pid %d); the Spark driver's log: %s on %s",
            self.dump_id,
            self._detached.pid,
            path,
            socket.gethostname(),
        )
        return self._detached.pid

    def kill(self) -> None:
        """Cancel the dump (so nothing resumes it by itself), then kill spark-submit and every
        process under it. spark-submit's JVM starts the Python driver as its child: killing
        the JVM alone leaves the driver (and its local executors) running."""
        try:
            self.hook.store.dumps.cancel(self.dump_id)
            log.info("dump %s cancelled", self.dump_id)
        except DBLogError as exc:
            log.warning("could not cancel dump %s: %s", self.dump_id, exc)
        spark = self.__dict__.get("spark")  # only if `spark` was built: no connection read here
        # Private: `_submit_sp` is the spark-submit process that `submit()` started; the
        # provider's `on_kill` kills it alone, and only its pid finds the driver under it.
        submitted = [self._detached, spark._submit_sp if spark is not None else None]
        tree = [p for process in submitted if process is not None for p in _tree(process.pid)]
        if spark is not None:
            spark.on_kill()
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()


def _tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants, while they run."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
