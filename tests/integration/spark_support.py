"""Stopping a test's Spark for good, so the next test module starts a fresh JVM.

Python workers inherit the environment the JVM was launched with; a JVM left over from an
earlier module would not know the passwords a later module puts in the environment.
"""

from __future__ import annotations

from pyspark import SparkContext
from pyspark.sql import SparkSession


def stop_spark(session: SparkSession) -> None:
    session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
