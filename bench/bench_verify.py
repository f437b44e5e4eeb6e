"""`dblog verify` against its references, on a table of 1M rows (5M with --big): the PostgreSQL
SQL target the tailer keeps, and the lake; equal, then with 0.1% of the target's rows corrupted
(a third each changed, deleted, extra), then the same while pgbench writes to the source.

Side by side on the same tables: reladiff's hashdiff of the same source and SQL target, our
direct dump of the table (the ceiling of reading it our way), a full sequenced re-dump (what
a repair saves), and on MariaDB pt-table-checksum with pt-table-sync (MySQL users' reference).
Each prints rows/s, the corrupted keys it found against the keys corrupted, and the other keys
it reported (false differences). Every check runs as a user runs it: `dblog` commands in their
own processes, the tailer (`dblog tail`) in its own.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from support import Env, load_average, step
from verify_bench.checksum import checksum_part
from verify_bench.corrupt import Corruption, trigger_written, written
from verify_bench.deployment import Deployment, VerifyRun, create_tables
from verify_bench.reladiff import reladiff
from verify_bench.writes import pgbench

from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.devservices.postgres import PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.verify.request import DEFAULT_CHUNK_SIZE

CHUNK_SIZE = 5_000
"""Rows a chunk of the sequenced dumps (the fill, the re-dump)."""
PARTS = ("postgres", "lake", "mariadb")


@dataclass
class Report:
    rows: int
    lines: list[tuple[str, str, str, str]] = field(default_factory=list)
    """The table at the end: what, rows/s, corrupted keys found, other keys."""

    def figure(self, line: str) -> None:
        print(line, flush=True)

    def row(self, what: str, seconds: float, found: str = "", other: str = "") -> None:
        self.lines.append((what, f"{self.rows / seconds:,.0f}", found, other))

    def table(self) -> str:
        head = ("check", "rows/s", "corrupted keys found", "other keys")
        widths = [max(len(line[i]) for line in [head, *self.lines]) for i in range(4)]
        return "\n".join(
            f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d:>{widths[3]}}"
            for a, b, c, d in [head, *self.lines]
        )


def found_line(corruption: Corruption, found: set) -> tuple[int, int, str]:
    right, other = corruption.judge(found)
    return right, other, f"found {right} of {len(corruption)} corrupted keys, {other} other keys"


def verify_line(label: str, run: VerifyRun, rows: int) -> str:
    return (
        f"{label}: {rows} rows in {run.seconds:.1f} s, {rows / run.seconds:.0f} rows/s, "
        f"{run.counts.get('in_flux', 0)} in flux"
    )


def postgres_part(
    env: Env,
    report: Report,
    rows: int,
    rate: int,
    py_spy: str | None,
    *,
    equal_only: bool,
    verify_chunk: int | None,
) -> dict[str, float]:
    """The SQL target: equal, corrupted and repaired, under writes (not with `equal_only`);
    reladiff and the dumps beside, verify's chunks `verify_chunk` rows (None: its default).
    The rows/s and seconds the ratios need."""
    target_dsn = env.pg.dsn.rsplit("/", 1)[0] + "/vtarget"
    deployment = Deployment(env, "vsql", lake=False, py_spy=py_spy)
    try:
        step("filling the SQL target: a sequenced dump through the tailer")
        fill = deployment.dump(mode="sequenced", chunk_size=CHUNK_SIZE)
        report.figure(f"V0 fill, sequenced dump: {rows / fill:.0f} rows/s ({fill:.1f} s)")

        step("equal")
        equal = deployment.verify("equal", chunk_size=verify_chunk)
        report.figure(
            verify_line("V1 verify equal", equal, rows) + f", {len(equal.found)} keys differ"
        )
        report.row("verify, equal", equal.seconds, "", str(len(equal.found)))
        two = deployment.verify("equal-2", parallelism=2, chunk_size=verify_chunk)
        report.figure(verify_line("V1p verify equal, parallelism 2", two, rows))
        report.row("verify, equal, parallelism 2", two.seconds, "", str(len(two.found)))
        seconds, found = reladiff(env)
        rel_rate = rows / seconds
        report.figure(
            f"V1r reladiff equal: {rel_rate:.0f} rows/s ({seconds:.1f} s), {len(found)} keys differ"
        )
        report.row("reladiff, equal", seconds, "", str(len(found)))
        direct = deployment.dump(mode="direct")
        report.figure(f"V1d direct dump: {rows / direct:.0f} rows/s ({direct:.1f} s)")
        report.row("direct dump", direct)
        read_chunk = verify_chunk or DEFAULT_CHUNK_SIZE
        read = deployment.read_rate(read_chunk)
        report.figure(
            f"V1c read ceiling: {read:.0f} rows/s (the table read in chunks of {read_chunk})"
        )
        report.row("read ceiling (one side)", rows / read)
        figures = {
            "verify": rows / equal.seconds,
            "reladiff": rel_rate,
            "direct": rows / direct,
            "read": read,
        }
        if equal_only:
            return figures

        step("0.1% of the target corrupted")
        corruption = Corruption.pick(rows, seed=1)
        corruption.apply_sql(target_dsn)
        seconds, found = reladiff(env)
        right, other, text = found_line(corruption, found)
        report.figure(f"V2r reladiff corrupted: {rows / seconds:.0f} rows/s, {text}")
        report.row("reladiff, 0.1% corrupted", seconds, f"{right}/{len(corruption)}", str(other))
        trigger_written(target_dsn)
        repaired = deployment.verify("corrupted", repair=True, chunk_size=verify_chunk)
        keys = written(target_dsn)
        right, other, text = found_line(corruption, repaired.found)
        wrong = len(keys - {key for _, key in corruption.keys})
        after = deployment.verify("repaired", chunk_size=verify_chunk)
        report.figure(
            f"V2 verify corrupted with repair: {repaired.seconds:.1f} s, {text}; {len(keys)} keys "
            f"written, {wrong} of them not corrupted; then {len(after.found)} keys differ"
        )
        report.row(
            "verify+repair, 0.1% corrupted",
            repaired.seconds,
            f"{right}/{len(corruption)}",
            str(other),
        )
        redump = deployment.dump(mode="sequenced", chunk_size=CHUNK_SIZE)
        report.figure(f"V3 full re-dump, sequenced: {rows / redump:.0f} rows/s ({redump:.1f} s)")
        report.row("full re-dump, sequenced", redump)

        step(f"corrupted again, pgbench writing {rate} updates/s")
        corruption = Corruption.pick(rows, seed=2)
        corruption.apply_sql(target_dsn)
        with pgbench(env, rows, rate) as load:
            busy = deployment.verify("writes", chunk_size=verify_chunk)
        right, other, text = found_line(corruption, busy.found)
        report.figure(
            verify_line("V4 verify under writes", busy, rows)
            + f", {text}; {load.per_s:.0f} updates/s"
        )
        report.row(
            "verify, 0.1% corrupted, writes", busy.seconds, f"{right}/{len(corruption)}", str(other)
        )
        with pgbench(env, rows, rate) as load:
            seconds, found = reladiff(env)
        right, other, text = found_line(corruption, found)
        report.figure(
            f"V4r reladiff under writes: {rows / seconds:.0f} rows/s, {text}; "
            f"{load.per_s:.0f} updates/s"
        )
        report.row(
            "reladiff, 0.1% corrupted, writes", seconds, f"{right}/{len(corruption)}", str(other)
        )
    finally:
        deployment.close()
    return {**figures, "repair_s": repaired.seconds, "redump_s": redump, "wrong": wrong}


def lake_part(env: Env, report: Report, rows: int, rate: int, py_spy: str | None) -> None:
    """The lake: filled by a direct dump, equal, corrupted through deltalake, under writes."""
    deployment = Deployment(env, "vlake", lake=True, py_spy=py_spy)
    try:
        step("filling the lake: a direct dump")
        fill = deployment.dump(mode="direct")
        report.figure(
            f"L0 fill, direct dump into the lake: {rows / fill:.0f} rows/s ({fill:.1f} s)"
        )
        report.row("lake: direct dump", fill)
        equal = deployment.verify("lake-equal")
        report.figure(
            verify_line("L1 lake verify equal", equal, rows) + f", {len(equal.found)} keys differ"
        )
        report.row("lake: verify, equal", equal.seconds, "", str(len(equal.found)))
        corruption = Corruption.pick(rows, seed=3)
        corruption.apply_lake(deployment.lake_root)
        run = deployment.verify("lake-corrupted")
        right, other, text = found_line(corruption, run.found)
        report.figure(verify_line("L2 lake verify corrupted", run, rows) + f", {text}")
        report.row(
            "lake: verify, 0.1% corrupted", run.seconds, f"{right}/{len(corruption)}", str(other)
        )
        with pgbench(env, rows, rate) as load:
            run = deployment.verify("lake-writes")
        right, other, text = found_line(corruption, run.found)
        report.figure(
            verify_line("L4 lake verify under writes", run, rows)
            + f", {text}; {load.per_s:.0f} updates/s"
        )
        report.row(
            "lake: verify, corrupted, writes", run.seconds, f"{right}/{len(corruption)}", str(other)
        )
    finally:
        deployment.close()


@contextlib.contextmanager
def kept_or_temporary(keep: str | None) -> Iterator[str]:
    if keep is not None:
        Path(keep).mkdir(parents=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="dblog-bench-verify-") as tmp:
        yield tmp


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 100 updates/s")
    parser.add_argument("--big", action="store_true", help="5,000,000 rows")
    parser.add_argument("--rows", type=int, help="rows in the table (default 1,000,000)")
    parser.add_argument("--rate", type=int, help="updates/s the write load commits (default 500)")
    parser.add_argument(
        "--equal-only",
        action="store_true",
        help="postgres: the equal target only (V0, V1, V1p, V1r, V1d, V1c), no corruption",
    )
    parser.add_argument(
        "--verify-chunk-size",
        type=int,
        help="rows a chunk of the SQL target's verify runs (default: verify's own)",
    )
    parser.add_argument("--only", help=f"some parts, comma-separated: {', '.join(PARTS)}")
    parser.add_argument(
        "--py-spy",
        metavar="PATH",
        help="py-spy's binary: each verify runs under `py-spy record --idle`, its raw stacks "
        "kept in --keep's directory",
    )
    parser.add_argument("--keep", help="a directory for the servers and logs, kept afterwards")
    args = parser.parse_args(argv)
    rows = args.rows or (20_000 if args.quick else 5_000_000 if args.big else 1_000_000)
    rate = args.rate or (100 if args.quick else 500)
    parts = PARTS if args.only is None else tuple(args.only.split(","))
    if unknown := set(parts) - set(PARTS):
        parser.error(
            f"--only: unknown parts {', '.join(sorted(unknown))} (know {', '.join(PARTS)})"
        )
    print(f"load average (1, 5, 15 min) at the start: {load_average()}", flush=True)
    report = Report(rows)
    ratios: dict[str, float] = {}
    with (
        kept_or_temporary(args.keep) as tmp,
        contextlib.ExitStack() as stack,
    ):
        base = Path(tmp)
        step(f"starting the servers in {base}")
        pg = stack.enter_context(PostgresServer(base / "pg"))
        rds = stack.enter_context(RedisServer(base / "redis"))
        mariadb = None
        if "mariadb" in parts and shutil.which("pt-table-checksum") is None:
            report.figure(
                "M pt-table-checksum skipped: not installed (scripts/install-system-deps.sh)"
            )
        elif "mariadb" in parts:
            mariadb = stack.enter_context(MariaDBServer(base / "mariadb"))
        env = Env(base, pg.info, rds.info, None if mariadb is None else mariadb.info)
        if "postgres" in parts or "lake" in parts:
            step(f"the source table: {rows} rows")
            create_tables(env, rows)
        if "postgres" in parts:
            ratios = postgres_part(
                env,
                report,
                rows,
                rate,
                args.py_spy,
                equal_only=args.equal_only,
                verify_chunk=args.verify_chunk_size,
            )
        if "lake" in parts:
            lake_part(env, report, rows, rate, args.py_spy)
        if mariadb is not None:
            checksum_part(env, mariadb, stack, report, rows, rate)
    if ratios:
        report.figure(
            f"R verify / reladiff rows/s: {ratios['verify'] / ratios['reladiff']:.3f} (goal >= 0.5)"
        )
        report.figure(
            f"R verify / direct dump rows/s: {ratios['verify'] / ratios['direct']:.3f} "
            "(goal >= 0.7)"
        )
        report.figure(
            f"R verify / read ceiling rows/s: {ratios['verify'] / ratios['read']:.3f} (verify "
            "reads the table twice, the source and the target)"
        )
    if "redump_s" in ratios:
        report.figure(
            f"R verify+repair / full re-dump time: {ratios['repair_s'] / ratios['redump_s']:.3f} "
            f"(goal <= 0.5), {ratios['wrong']:.0f} keys written that were not corrupted"
        )
    print()
    print(report.table())
    verify_chunk = args.verify_chunk_size or DEFAULT_CHUNK_SIZE
    print(
        f"\n{rows:,} rows, verify's chunks {verify_chunk:,} rows, the dumps' {CHUNK_SIZE:,}, "
        f"writes {rate} updates/s"
    )
    print(f"load average (1, 5, 15 min) at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
