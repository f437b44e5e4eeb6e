"""A stored dump request run in a Spark application: the driver runs the same loop as `dblog dump`
(`runner.run_dump`: planning, controls, progress, retries, up to `parallelism` windows in flight,
each in its own driver thread and so its own Spark job), its chunks read by Spark tasks: a
sequenced dump's through `spark_chunk.SparkChunkReader` (rows into the window in Redis, for the
tailer to emit), a direct dump's through `spark_direct.SparkDirectReader` (rows staged into the
direct target, committed by the driver). Chunks are always bounded, so each can be cut into
sub-ranges."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pyspark import SparkContext

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.direct_target import DirectTarget
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.dump.runner import DumpFailed, patiently, run_dump
from airflow_provider_dblog.dump.spark_chunk import SparkChunkReader
from airflow_provider_dblog.dump.spark_direct import SparkDirectReader
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore


def run_spark_dump(
    sc: SparkContext,
    config: Config,
    dump_id: str,
    open_target: Callable[[Config], DirectTarget],
    *,
    tasks: int | None = None,
    window_timeout_s: float = 60.0,
    source_patience_s: float = SOURCE_PATIENCE_S,
) -> DumpState:
    """Run one stored dump request in this Spark application; returns its final state.
    `open_target` opens a direct dump's target (`targets.direct_target_for`: it is composed
    above this package), in the driver and in each task. A driver started while Redis is
    away (a restart, a failover) waits for it for up to `source_patience_s`, as the dump
    does between chunks."""
    store = StateStore(config.redis_client(), config.source.name)
    stored = patiently(partial(store.dumps.get, dump_id), source_patience_s)
    if stored is None:
        raise DumpFailed(f"no dump request {dump_id!r} in the store")
    reader = SparkChunkReader(
        sc, config, dump_id, tasks or sc.defaultParallelism, stored.request.chunk_size
    )
    direct = None
    if stored.request.mode is DumpMode.DIRECT:  # rows staged by the tasks: spark_direct.py
        direct = SparkDirectReader(
            sc,
            config,
            dump_id,
            reader.tasks,
            stored.request.chunk_size,
            open_target(config),
            open_target,
        )
    try:
        return run_dump(
            store,
            source_for(config.source).chunk_source,
            dump_id,
            window_timeout_s=window_timeout_s,
            source_patience_s=source_patience_s,
            read=reader,
            direct=direct,
            bounded_chunks=True,
        )
    finally:
        if direct is not None:
            direct.target.close()
