"""`dblog verify`: compare the target with the source while writes go on, and report what differs.

The request is checked whole first (what to verify as `dblog dump` takes it, a key range, the
target: see `verify/request.py`), so bad input exits 2 with nothing stored; then the run is
stored in Redis and runs in this process (`verify/runner.py`), the tailer recording each chunk's
windows. The report gives the counts per table and the first differing keys (all of them stay
in the store). Exit status: 0 when the target equals the source, 1 when keys differ, 2 on an
error or a run that failed (or a repair that did not finish). The same `--verify-id` run again
resumes an unfinished or failed run from its last verified chunk, and shows a finished one's
report; while a live process runs it, another is refused in one line (`verify/runner.running`).
`--repair auto` ends a run that found differences with their repair (`verify/repair.py`): extra
keys removed from the target, a key dump a table of the others, run in this process; given to a
finished run, it repairs that run (or resumes its repair). `--master` reads each chunk's sides
in Spark tasks, this process the driver (`verify/spark_run.py`).

`verify-pause`, `verify-resume`, `verify-cancel` and `verify-throttle` act on a run from anywhere,
as `dblog pause|resume|cancel|throttle` act on a dump: the runner reads its controls between
chunks. A cancelled run resumes when run again with its `--verify-id`.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    control,
    option,
    setup_logging,
    store_of,
)
from airflow_provider_dblog.config import Config, ConfigError, parse_config
from airflow_provider_dblog.core import values
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.dump.direct import InProcessDirectReader
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.sources.base import ChunkSource, Source
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.spark_package import ship_package, use_driver_python
from airflow_provider_dblog.state import DumpControls, DumpState, StateStore, VerifyState
from airflow_provider_dblog.state.verifies import COUNTERS
from airflow_provider_dblog.targets import direct_target_for
from airflow_provider_dblog.verify.chunk import IN_PROCESS, ChunkHasher
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.repair import (
    REPAIRS,
    KeyRemover,
    key_remover_for,
    prepare_repair,
)
from airflow_provider_dblog.verify.request import VerifyRequest, build_verify_request
from airflow_provider_dblog.verify.runner import ChunkGaveUp, Slot, run_verify, running
from airflow_provider_dblog.verify.targets import target_reader_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    verify = subparsers.add_parser(
        "verify", help="compare the target with the source, while writes go on"
    )
    add_config_option(verify)
    verify.add_argument(
        "--config-json",
        help="the configuration's sections as one JSON object instead of --config (what "
        "Airflow's verify operator passes: no password is in it)",
    )
    verify.add_argument("--table", help="one table, 'schema.table' (default: all captured tables)")
    verify.add_argument("--keys", help="primary keys of --table: '1,2,3' or JSON '[[1,\"a\"]]'")
    verify.add_argument("--where", help="only the rows of --table matching this condition")
    verify.add_argument("--after", help="a key of --table: verify the keys above it")
    verify.add_argument("--upto", help="a key of --table: verify the keys up to it")
    verify.add_argument(
        "--target", default="output", help="what to verify: output (default), or lake"
    )
    verify.add_argument(
        "--chunk-size", type=option(values.whole_number(1)), help="rows a chunk (default: 50,000)"
    )
    verify.add_argument(
        "--parallelism",
        type=option(values.whole_number(1)),
        default=1,
        help="chunks of a table verified at once, each its own key range and windows: faster, "
        "and more load on the source and the target (default: %(default)s; a new run's)",
    )
    verify.add_argument(
        "--max-rows-per-s",
        type=option(values.finite_number(0)),
        help="rate limit, rows checked a second (dblog verify-throttle changes it)",
    )
    verify.add_argument(
        "--verify-id", type=option(values.dump_id), help="resume this run, or give a new one its id"
    )
    verify.add_argument(
        "--window-timeout",
        type=option(values.finite_number(0, above=True)),
        default=60.0,
        help="seconds a chunk waits for the tailer (its windows, the target catching up) "
        "before it is read again (default: %(default)s)",
    )
    verify.add_argument(
        "--show",
        type=option(values.whole_number(0)),
        default=20,
        help="differing keys the report lists (default: %(default)s; all are stored)",
    )
    verify.add_argument(
        "--master",
        help="read each chunk's sides in Spark tasks on this Spark master (e.g. local[4], "
        "yarn), this process the driver (default: read them in this process)",
    )
    verify.add_argument(
        "--tasks",
        type=option(values.whole_number(1)),
        help="with --master: Spark tasks a side of a chunk (default: Spark's parallelism)",
    )
    verify.add_argument(
        "--repair",
        choices=REPAIRS,
        default="none",
        help="auto: once the run is done, remove the target's extra keys and re-send the other "
        "differing keys with a key dump (default: %(default)s)",
    )
    verify.set_defaults(func=_verify)

    for name, help_text in (
        ("pause", "pause a verify run after its chunks in flight"),
        ("resume", "resume a paused verify run"),
        ("cancel", "cancel a verify run after its chunks in flight"),
    ):
        control = subparsers.add_parser(f"verify-{name}", help=help_text)
        add_config_option(control)
        control.add_argument("verify_id", type=option(values.dump_id))
        control.set_defaults(func=_control, action=name)

    throttle = subparsers.add_parser("verify-throttle", help="change a verify run's pace")
    add_config_option(throttle)
    throttle.add_argument("verify_id", type=option(values.dump_id))
    throttle.add_argument(
        "--chunk-size", type=option(values.whole_number(1)), help="rows the next chunks read"
    )
    throttle.add_argument(
        "--delay-ms", type=option(values.whole_number(0)), help="pause between chunks"
    )
    throttle.add_argument(
        "--max-rows-per-s", type=option(values.finite_number(0)), help="0 removes the limit"
    )
    throttle.set_defaults(func=_control, action="throttle")


def _verify(args: argparse.Namespace) -> int:
    setup_logging()
    if args.table is None and (args.keys or args.where or args.after or args.upto):
        raise InvalidRequest("--keys, --where, --after and --upto need --table")
    config = _config(args)
    store = store_of(config)
    verify_id = args.verify_id or uuid.uuid4().hex[:12]
    chunk_sources = source_for(config.source)
    source = chunk_sources.chunk_source()
    reader: TargetReader | None = None
    remover: KeyRemover | None = None
    try:
        stored = store.verifies.request(verify_id)
        if stored is None:
            reader = target_reader_for(config, args.target)
            request = build_verify_request(
                config,
                source,
                verify_id=verify_id,
                table=args.table,
                keys=args.keys,
                where=args.where,
                after=args.after,
                upto=args.upto,
                chunk_size=args.chunk_size,
                target=args.target,
                reader=reader,
                parallelism=args.parallelism,
            )
            if args.repair == "auto":
                remover = key_remover_for(config, request.target)
        else:
            if args.table is not None:
                raise InvalidRequest(
                    f"--verify-id {verify_id} is a run stored with its request: leave out "
                    "--table, --keys, --where, --after and --upto to resume it, or give a new "
                    "run another --verify-id"
                )
            request = VerifyRequest.from_json(verify_id, stored)
            status = store.verifies.status(verify_id)
            if status is not None and status.state is VerifyState.DONE and args.repair == "none":
                return _report(store, request, args, sys.stdout)
            if args.repair == "auto":
                remover = key_remover_for(config, request.target)
        with running(store, verify_id) as still_ours:
            status = store.verifies.status(verify_id)
            if reader is None:  # a stored run, resumed: its target is in its request
                reader = target_reader_for(config, request.target)
                if status is not None and status.state is not VerifyState.DONE:
                    store.verifies.reopen(verify_id)
            else:
                store.verifies.create(verify_id, request.to_json())
            if args.max_rows_per_s is not None:
                store.verifies.throttle(verify_id, max_rows_per_s=args.max_rows_per_s)
            if status is None or status.state is not VerifyState.DONE:
                print(
                    f"verify {verify_id}: running ({request.describe()}; dblog "
                    f"verify-pause|verify-resume|verify-cancel|verify-throttle {verify_id})",
                    flush=True,
                )
                controls = store.verifies.controls(verify_id)
                if controls is not None and controls.paused:
                    print(
                        f"verify {verify_id}: paused until dblog verify-resume {verify_id}",
                        flush=True,
                    )
                with _hasher(args, config, request) as hasher:
                    run_verify(
                        store,
                        lambda: _open_slot(config, chunk_sources, request.target),
                        request,
                        window_timeout_s=args.window_timeout,
                        between_chunks=still_ours,
                        hasher=hasher,
                    )
            if remover is not None and _differing(store, verify_id):
                _repair(store, config, chunk_sources, source, reader, remover, request, args)
    finally:
        for opened in (reader, remover):
            if opened is not None:
                opened.close()
        source.close()
    return _report(store, request, args, sys.stdout)


def _open_slot(config: Config, sources: Source, target: str) -> Slot:
    """A source and a target reader for one chunk in flight."""
    source = sources.chunk_source()
    try:
        return Slot(source, target_reader_for(config, target))
    except BaseException:
        source.close()
        raise


@contextmanager
def _hasher(
    args: argparse.Namespace, config: Config, request: VerifyRequest
) -> Iterator[ChunkHasher]:
    """Who reads a chunk's sides: this process, or with `--master` Spark tasks, this process
    the driver of a Spark application started here and stopped after the run."""
    if args.master is None:
        yield IN_PROCESS
        return
    from pyspark.sql import SparkSession  # only a run on Spark loads pyspark

    from airflow_provider_dblog.verify.spark_run import spark_hasher

    use_driver_python()
    spark = SparkSession.builder.appName(f"dblog-verify-{request.verify_id}")
    session = spark.master(args.master).getOrCreate()
    try:
        ship_package(session.sparkContext)
        yield spark_hasher(session.sparkContext, config, request, args.tasks)
    finally:
        session.stop()


def _control(args: argparse.Namespace) -> int:
    store = store_of(config_of(args))
    return control(store.verifies, "verify", args.verify_id, args)


def _config(args: argparse.Namespace) -> Config:
    if args.config_json is None:
        return config_of(args)
    try:
        data = json.loads(args.config_json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config-json is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--config-json must be a JSON object of the TOML's sections")
    return parse_config(data, "--config-json")


def _differing(store: StateStore, verify_id: str) -> int:
    """The keys a finished run found differing (0 for a run that did not finish)."""
    status = store.verifies.status(verify_id)
    if status is None or status.state is not VerifyState.DONE:
        return 0
    counts = store.verifies.counts(verify_id).values()
    return sum(found[c] for found in counts for c in COUNTERS[2:])


def _repair(
    store: StateStore,
    config: Config,
    sources: Source,
    source: ChunkSource,
    reader: TargetReader,
    remover: KeyRemover,
    request: VerifyRequest,
    args: argparse.Namespace,
) -> None:
    """Repair the run's differing keys (`verify/repair.py`) and run its key dumps here, each
    resumed from its progress when a repair before this one stopped."""
    verify_id = request.verify_id
    print(f"verify {verify_id}: repairing its differing keys", flush=True)
    try:
        repair = prepare_repair(
            store, config, source, reader, remover, request, window_timeout_s=args.window_timeout
        )
    except ChunkGaveUp as exc:
        print(f"verify {verify_id}: the repair stopped: {exc}", file=sys.stderr)
        return
    for dump_id in repair.dumps:
        stored = store.dumps.get(dump_id)
        status = store.dumps.status(dump_id)
        if stored is None or status is None or status.state is DumpState.DONE:
            continue
        if status.state.finished:
            store.dumps.reopen(dump_id)
        direct = None
        if stored.request.mode is DumpMode.DIRECT:
            direct = InProcessDirectReader(direct_target_for(config))
        try:
            run_dump(
                store,
                sources.chunk_source,
                dump_id,
                window_timeout_s=args.window_timeout,
                direct=direct,
            )
        finally:
            if direct is not None:
                direct.target.close()


def _report(
    store: StateStore, request: VerifyRequest, args: argparse.Namespace, out: TextIO
) -> int:
    """Print the run's counts per table, its first differing keys and its repair; the exit
    status."""
    verify_id = request.verify_id
    status = store.verifies.status(verify_id)
    assert status is not None, f"verify run {verify_id} has a request but no status"
    counts = store.verifies.counts(verify_id)
    reason = f" ({status.reason})" if status.reason else ""
    print(f"verify {verify_id}: {status.state}{reason}: {request.describe()}", file=out)
    headers = ("table", *(c.replace("_", " ") for c in COUNTERS))
    lines = [headers]
    for table in request.tables:
        found = counts.get(table, dict.fromkeys(COUNTERS, 0))
        lines.append((str(table), *(str(found[c]) for c in COUNTERS)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    for line in lines:
        cells = [
            line[0].ljust(widths[0]),
            *(v.rjust(w) for v, w in zip(line[1:], widths[1:], strict=True)),
        ]
        print("  ".join(cells), file=out)
    differing = sum(found[c] for found in counts.values() for c in COUNTERS[2:])
    if differing:
        first = store.verifies.differences(verify_id, args.show)
        print(f"{differing} keys differ; the first {len(first)}:", file=out)
        for difference in first:
            print(f"  {difference.table} {difference.kind} {list(difference.key)}", file=out)
    repaired = _repair_line(store, status.removed, status.repair_dumps)
    if repaired is not None:
        print(repaired[0], file=out)
    controls = store.verifies.controls(verify_id)
    if controls is not None and status.state is not VerifyState.DONE:
        print(f"controls: {controls_text(controls)}", file=out)
    if status.state is not VerifyState.DONE:
        ended = "was cancelled" if status.state is VerifyState.CANCELLED else "did not finish"
        print(
            f"verify {verify_id} {ended}; to resume it: dblog verify --verify-id {verify_id}",
            file=sys.stderr,
        )
        return 2
    if differing and args.repair == "auto" and (repaired is None or not repaired[1]):
        print(
            f"verify {verify_id}: the repair did not finish; to resume it: dblog verify "
            f"--verify-id {verify_id} --repair auto",
            file=sys.stderr,
        )
        return 2
    return 1 if differing else 0


def _repair_line(
    store: StateStore, removed: int, dumps: tuple[str, ...] | None
) -> tuple[str, bool] | None:
    """The report's line on the run's repair, and whether every dump of it is done; None
    without a repair."""
    if dumps is None:
        return None
    done = True
    states = []
    for dump_id in dumps:
        status = store.dumps.status(dump_id)
        done = done and status is not None and status.state is DumpState.DONE
        what = "missing" if status is None else f"{status.state}, {status.rows} rows"
        states.append(f"{dump_id} ({what})")
    resent = f"; key dumps {', '.join(states)}" if states else ""
    return f"repair: {removed} extra keys removed from the target{resent}", done


def controls_text(controls: DumpControls) -> str:
    """A run's controls on one line, as `dblog status --dump` shows a dump's."""
    rate = controls.max_rows_per_s
    return (
        f"{'paused, ' if controls.paused else ''}{'cancelled, ' if controls.cancelled else ''}"
        f"chunk size {controls.chunk_size}, delay {controls.delay_ms} ms, "
        f"{'no rate limit' if rate is None else f'{rate:g} rows/s'}"
    )
