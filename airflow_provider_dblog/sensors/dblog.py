"""Sensors: a dump has finished; the tailer is healthy with a lag below a threshold.

Both can poke (a worker slot while waiting, cheap for short waits) or defer to a trigger in
the triggerer (`deferrable=True`, for long waits).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, conf
from airflow.sdk.exceptions import AirflowException

from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.state import DumpState
from airflow_provider_dblog.triggers.dblog import (
    DBLogDumpTrigger,
    DBLogTailerHealthTrigger,
    health_ok,
)
from airflow_provider_dblog.triggers.outcome import DumpOutcome, TailerHealthy


class DBLogDumpSensor(BaseSensorOperator):
    """Waits until a dump is done; fails if it failed, was cancelled, or is unknown.

    :param dump_id: the dump to wait for.
    :param dblog_conn_id: the `dblog` connection.
    :param deferrable: wait in the triggerer.
    :param driver_timeout_s: when deferred, fail if no process has run the dump for this long.
    """

    template_fields: Sequence[str] = ("dump_id", "dblog_conn_id")

    def __init__(
        self,
        *,
        dump_id: str,
        dblog_conn_id: str = DBLogHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        driver_timeout_s: float = 24 * 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dump_id = dump_id
        self.dblog_conn_id = dblog_conn_id
        self.deferrable = deferrable
        self.driver_timeout_s = driver_timeout_s

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=DBLogDumpTrigger(
                self.dblog_conn_id, self.dump_id, self.poke_interval, self.driver_timeout_s
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> bool:
        outcome = DumpOutcome.of(self.dump_id, self.hook.dump_status(self.dump_id))
        self._check(outcome)
        return outcome.state is DumpState.DONE

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        outcome = DumpOutcome.from_event(event)
        self._check(outcome)
        if outcome.stalled:
            raise AirflowException(
                f"dump {self.dump_id} has had no running process for {self.driver_timeout_s}s"
            )
        return outcome.to_event()

    def _check(self, outcome: DumpOutcome) -> None:
        if outcome.state is None:
            raise AirflowException(f"no dump {self.dump_id} in the state store")
        if outcome.state is DumpState.FAILED:
            raise AirflowException(f"dump {self.dump_id} failed: {outcome.reason}")
        if outcome.state is DumpState.CANCELLED:
            raise AirflowException(f"dump {self.dump_id} was cancelled")


class DBLogTailerHealthSensor(BaseSensorOperator):
    """Waits until the source's tailer beats with a lag of at most `max_lag_ms`: put it before
    a dump, whose chunks only complete while a tailer runs.

    :param dblog_conn_id: the `dblog` connection.
    :param max_lag_ms: the largest acceptable lag behind the source's log.
    :param deferrable: wait in the triggerer.
    """

    template_fields: Sequence[str] = ("max_lag_ms", "dblog_conn_id")

    def __init__(
        self,
        *,
        dblog_conn_id: str = DBLogHook.default_conn_name,
        max_lag_ms: int = 60_000,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dblog_conn_id = dblog_conn_id
        self.max_lag_ms = max_lag_ms
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # A healthy tailer needs no wait. Deferring anyway would have the trigger fire at once,
        # which Airflow 3.3 can race into failing the resumed task: the stale "success" of
        # the deferring process arrives after the resumed one runs (apache/airflow#72716).
        health = self.hook.tailer_health()
        if health_ok(health, int(self.max_lag_ms)):
            return self.execute_complete(context, TailerHealthy(health).to_event())
        self.defer(
            trigger=DBLogTailerHealthTrigger(
                self.dblog_conn_id, int(self.max_lag_ms), self.poke_interval
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> bool:
        health = self.hook.tailer_health()
        if not health_ok(health, int(self.max_lag_ms)):
            self.log.info("tailer not healthy yet: %s", health or "no heartbeat")
            return False
        return True

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        healthy = TailerHealthy.from_event(event)
        self.log.info("tailer healthy: %s", healthy.health)
        return healthy.to_event()
