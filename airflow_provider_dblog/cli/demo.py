"""`dblog demo`: DBLog end to end on private servers, nothing to set up (see `demo/story.py`).

The demo and the throwaway servers it starts are imported only when the verb runs: no other
`dblog` command, and nothing Airflow loads, imports them. They run from a clone: the wheel
leaves them out."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_dblog.cli.common import from_a_clone

if TYPE_CHECKING:
    from airflow_provider_dblog.demo.story import DemoBackend


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the tailer, a full dump and a repair under writes; verify the target"
    )
    parser.add_argument("--rows", type=int, default=5000, help="rows seeded per table")
    parser.add_argument(
        "--chunk-size", type=int, default=500, help="rows a chunk reads (default: %(default)s)"
    )
    parser.add_argument(
        "--parallelism", type=int, default=2, help="chunks read at once (default: %(default)s)"
    )
    parser.add_argument(
        "--write-seconds",
        type=float,
        default=3.0,
        help="how long a writer changes rows while the dump runs (default: %(default)s)",
    )
    parser.add_argument(
        "--source",
        choices=("postgres", "mariadb"),
        default="postgres",
        help="the source database to start (mariadb: the target is the NDJSON stream)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="a read-only source: nothing is written to it, the watermarks are log positions",
    )
    parser.add_argument(
        "--replica",
        action="store_true",
        help="start a replica of the source too and read the dump's chunks from it, while the "
        "tailer follows the primary's log",
    )
    parser.add_argument(
        "--redis-ha",
        action="store_true",
        help="the state store behind Redis Sentinel (a primary, a replica, three sentinels); "
        "its primary is killed after the full dump and the replica promoted",
    )
    parser.set_defaults(func=from_a_clone("demo", _demo))


def _backend(source: str) -> type[DemoBackend]:
    if source == "mariadb":
        from airflow_provider_dblog.demo.mariadb import MariaDBDemo

        return MariaDBDemo
    from airflow_provider_dblog.demo.postgres import PostgresDemo

    return PostgresDemo


def _demo(args: argparse.Namespace) -> int:
    from airflow_provider_dblog.demo.story import run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    backend = _backend(args.source)
    summary = run_demo(
        backend,
        rows=args.rows,
        chunk_size=args.chunk_size,
        parallelism=args.parallelism,
        write_seconds=args.write_seconds,
        read_only=args.read_only,
        replica=args.replica,
        redis_ha=args.redis_ha,
    )
    print(
        f"\nsummary: {summary.rows_seeded} rows seeded, {summary.writes} write transactions "
        f"during the dump, {summary.dump_rows} rows dumped in {summary.dump_chunks} chunks "
        f"({summary.windows_retried} windows retried), {summary.repaired_keys} keys repaired, "
        f"{summary.events_emitted} events emitted, {summary.seconds:.1f}s"
    )
    if summary.equal:
        print(
            f"target == source: every row of accounts, orders and items matches ({backend.target})"
        )
        return 0
    print("target != source:\n  " + "\n  ".join(summary.differences))
    return 1
