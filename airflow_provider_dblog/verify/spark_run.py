"""A verify run on Spark: the driver runs the same loop as `dblog verify` (`runner.run_verify`:
planning, controls, counts saved in order, retries, up to `parallelism` chunks in flight, each
in its own driver thread and so its own Spark jobs), and writes each chunk's watermarks, waits
for the target and compares; Spark tasks read and hash each chunk's parts
(`spark_chunk.SparkChunkHasher`). `dblog verify --master` runs a new run so, the CLI process
the driver; `spark_jobs/verify.py` runs a stored one (what Airflow's verify operator submits).
"""

from __future__ import annotations

from pyspark import SparkContext

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.verify.request import VerifyRequest
from airflow_provider_dblog.verify.runner import Slot, run_verify, running
from airflow_provider_dblog.verify.spark_chunk import SparkChunkHasher
from airflow_provider_dblog.verify.targets import target_reader_for


def spark_hasher(
    sc: SparkContext, config: Config, request: VerifyRequest, tasks: int | None = None
) -> SparkChunkHasher:
    """The hasher of `request`'s chunks on `sc`: `tasks` a side of a chunk (default: Spark's
    parallelism)."""
    return SparkChunkHasher(
        sc,
        config,
        request.verify_id,
        request.target,
        tasks or sc.defaultParallelism,
        request.chunk_size,
    )


def run_spark_verify(
    sc: SparkContext,
    config: Config,
    verify_id: str,
    *,
    tasks: int | None = None,
    window_timeout_s: float = 60.0,
) -> VerifyState:
    """Run one stored verify run in this Spark application, claimed as `dblog verify` claims
    it; returns its final state. A failed or cancelled run runs again from its progress, a
    done one is left as it is."""
    store = StateStore(config.redis_client(), config.source.name)
    stored = store.verifies.request(verify_id)
    if stored is None:
        raise InvalidRequest(f"no verify run {verify_id!r} in the store")
    request = VerifyRequest.from_json(verify_id, stored)
    sources = source_for(config.source)

    def open_slot() -> Slot:
        source = sources.chunk_source()
        try:
            return Slot(source, target_reader_for(config, request.target))
        except BaseException:
            source.close()
            raise

    with running(store, verify_id) as still_ours:
        status = store.verifies.status(verify_id)
        if status is not None and status.state is VerifyState.DONE:
            return VerifyState.DONE
        store.verifies.reopen(verify_id)
        return run_verify(
            store,
            open_slot,
            request,
            window_timeout_s=window_timeout_s,
            between_chunks=still_ours,
            hasher=spark_hasher(sc, config, request, tasks),
        )
