"""Where a dump's CPU goes, from /proc: Spark's JVM tree (its Python workers run the tasks),
this process (the driver) and the PostgreSQL and Redis servers' process trees."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark import SparkContext
from support import tree_cpu_s


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds each part of a dump used while it ran."""

    tasks_s: float
    """The Spark JVM and its Python workers: the tasks (and the JVM's scheduling)."""
    driver_s: float
    """This process but the tailer's threads: the dump's driver (commits included)."""
    postgres_s: float
    redis_s: float

    @property
    def total_s(self) -> float:
        return self.tasks_s + self.driver_s + self.postgres_s + self.redis_s


@dataclass(frozen=True)
class CpuMeter:
    """Where a dump's CPU goes: the PostgreSQL and Redis servers' process trees, Spark's JVM
    tree (its Python workers run the tasks) and this process (the driver)."""

    postgres_pid: int
    redis_pid: int

    def sample(self, sc: SparkContext) -> CpuSplit:
        gateway = sc._gateway  # PySpark's JVM, started by this process (local master)
        assert gateway is not None
        jvm = gateway.proc.pid
        own = os.times()
        return CpuSplit(
            tree_cpu_s(jvm),
            own.user + own.system,
            tree_cpu_s(self.postgres_pid),
            tree_cpu_s(self.redis_pid),
        )
