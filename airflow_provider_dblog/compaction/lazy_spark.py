"""The compaction's SparkSession, started only when a run needs Spark: most runs of a
follower, and small batch runs, fold in the driver and never pay for a session."""

from __future__ import annotations

from pyspark.sql import SparkSession

from airflow_provider_dblog.spark_package import ship_package, use_driver_python


class LazySpark:
    """Call it for the session (the first call starts it, its workers on the driver's Python);
    `stop` ends it if it was started. `ship`: send the package to the executors."""

    def __init__(self, master: str | None, ship: bool) -> None:
        self._master, self._ship = master, ship
        self._session: SparkSession | None = None

    def __call__(self) -> SparkSession:
        if self._session is None:
            use_driver_python()
            builder = SparkSession.builder.appName("dblog-compact")
            if self._master:
                builder = builder.master(self._master)
            self._session = builder.getOrCreate()
            if self._ship:
                ship_package(self._session.sparkContext)
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
