"""`dblog verify`: compare the target with the source while writes go on, and report what differs.

The request is checked whole first (what to verify as `dblog dump` takes it, a key range, the
target: see `verify/request.py`), so bad input exits 2 with nothing stored; then the run is
stored in Redis and runs in this process (`verify/runner.py`), the tailer recording each chunk's
windows. The report gives the counts per table and the first differing keys (all of them stay
in the store). Exit status: 0 when the target equals the source, 1 when keys differ, 2 on an
error or a run that failed. The same `--verify-id` run again resumes an unfinished or failed
run from its last verified chunk, and shows a finished one's report; while a live process runs
it, another is refused in one line (`verify/runner.running`).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any, TextIO

from airflow_provider_dblog.cli.common import (
    add_config_option,
    config_of,
    option,
    setup_logging,
    store_of,
)
from airflow_provider_dblog.core import values
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.state.verifies import COUNTERS
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.request import VerifyRequest, build_verify_request
from airflow_provider_dblog.verify.runner import run_verify, running
from airflow_provider_dblog.verify.targets import target_reader_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    verify = subparsers.add_parser(
        "verify", help="compare the target with the source, while writes go on"
    )
    add_config_option(verify)
    verify.add_argument("--table", help="one table, 'schema.table' (default: all captured tables)")
    verify.add_argument("--keys", help="primary keys of --table: '1,2,3' or JSON '[[1,\"a\"]]'")
    verify.add_argument("--where", help="only the rows of --table matching this condition")
    verify.add_argument("--after", help="a key of --table: verify the keys above it")
    verify.add_argument("--upto", help="a key of --table: verify the keys up to it")
    verify.add_argument(
        "--target", default="output", help="what to verify: output (default), or lake"
    )
    verify.add_argument(
        "--chunk-size", type=option(values.whole_number(1)), help="rows a chunk (default: 5,000)"
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
    verify.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    setup_logging()
    if args.table is None and (args.keys or args.where or args.after or args.upto):
        raise InvalidRequest("--keys, --where, --after and --upto need --table")
    config = config_of(args)
    store = store_of(config)
    verify_id = args.verify_id or uuid.uuid4().hex[:12]
    source = source_for(config.source).chunk_source()
    reader: TargetReader | None = None
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
            )
        else:
            if args.table is not None:
                raise InvalidRequest(
                    f"--verify-id {verify_id} is a run stored with its request: leave out "
                    "--table, --keys, --where, --after and --upto to resume it, or give a new "
                    "run another --verify-id"
                )
            request = VerifyRequest.from_json(verify_id, stored)
            status = store.verifies.status(verify_id)
            if status is not None and status.state is VerifyState.DONE:
                return _report(store, request, args.show, sys.stdout)
        with running(store, verify_id) as still_ours:
            if reader is None:  # a stored run, resumed: its target is in its request
                store.verifies.reopen(verify_id)
                reader = target_reader_for(config, request.target)
            else:
                store.verifies.create(verify_id, request.to_json())
            print(f"verify {verify_id}: running ({request.describe()})", flush=True)
            run_verify(
                store,
                source,
                reader,
                request,
                window_timeout_s=args.window_timeout,
                on_chunk=lambda table: still_ours(),
            )
    finally:
        if reader is not None:
            reader.close()
        source.close()
    return _report(store, request, args.show, sys.stdout)


def _report(store: StateStore, request: VerifyRequest, show: int, out: TextIO) -> int:
    """Print the run's counts per table and its first differing keys; the exit status."""
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
        first = store.verifies.differences(verify_id, show)
        print(f"{differing} keys differ; the first {len(first)}:", file=out)
        for difference in first:
            print(f"  {difference.table} {difference.kind} {list(difference.key)}", file=out)
    if status.state is not VerifyState.DONE:
        print(
            f"verify {verify_id} did not finish; to resume it: dblog verify --verify-id "
            f"{verify_id}",
            file=sys.stderr,
        )
        return 2
    return 1 if differing else 0
