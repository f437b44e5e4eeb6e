"""`bench/bench_pipeline.py --quick`, `bench/bench_spark_dump.py --quick`,
`bench/bench_lake.py --quick`, `bench/bench_lake_verify.py --quick`,
`bench/bench_sustained.py --quick`, `bench/bench_read_only.py --quick` and
`bench/bench_verify.py --quick` run to the end and print their figures.

Only that the benchmark works is checked; its numbers are never compared with a threshold.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPT = BENCH / "bench_pipeline.py"
NUMBER = r"\d+(?:\.\d+)?"
BENCH_TIMEOUT_S = 1200
"""A deadline for a quick bench, not a measure of it: on a crowded machine a Spark bench's
`--quick` run has taken over five minutes."""


def test_bench_quick_prints_p1_p1s_p1u_p1b_p1b_heavy_p3_p4_p4b_e() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(
        rf"^P1 ours {NUMBER} events/s, ceiling {NUMBER} events/s .*ratio {NUMBER}", out, re.M
    ), out
    assert re.search(
        rf"^P1s ours {NUMBER} events/s, ceiling {NUMBER} events/s \(4 inserts a transaction\), "
        rf"ratio {NUMBER}",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^P1u ours {NUMBER} events/s, ceiling {NUMBER} events/s \(sysbench's update, update, "
        rf"delete, insert a transaction\), ratio {NUMBER}; {NUMBER} us/event",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^P1b ours {NUMBER} events/s, ceiling {NUMBER} events/s .*library {NUMBER} events/s "
        rf".*ratio {NUMBER} of the ceiling, {NUMBER} of the library",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^P1b heavy ours {NUMBER} events/s, ceiling {NUMBER} events/s .*ratio {NUMBER} of the "
        rf"ceiling \(P1b's {NUMBER}\)",
        out,
        re.M,
    ), out
    for label in ("no dump", "with dump", "with direct dump"):
        assert re.search(
            rf"^P3 latency {label}: p50 -?{NUMBER} ms, p99 -?{NUMBER} ms", out, re.M
        ), out
    assert re.search(rf"^P3 ratio p99 with dump / without -?{NUMBER}$", out, re.M), out
    assert re.search(rf"^P3 floor: p99 with direct dump / without -?{NUMBER}$", out, re.M), out
    assert re.search(rf"^P4 peak RSS {NUMBER} MiB, baseline RSS {NUMBER} MiB", out, re.M), out
    assert re.search(
        rf"^P4m peak RSS {NUMBER} MiB, baseline RSS {NUMBER} MiB \(\d+ rows in one MariaDB",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^P4b peak RSS {NUMBER} MiB, baseline RSS {NUMBER} MiB \(\d+ rows of ~\d+ bytes",
        out,
        re.M,
    ), out
    assert re.search(rf"^E emission of a pre-read chunk {NUMBER} ms per 10k rows", out, re.M), out


def test_spark_dump_bench_quick_prints_p2_and_ratio() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_spark_dump.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(rf"^P2 ceiling COPY \S+ TO STDOUT {NUMBER} rows/s", out, re.M), out
    for chunk_size in (10000, 50000):
        for parallelism in (1, 2):
            assert re.search(
                rf"^P2 chunk {chunk_size} parallelism {parallelism}: ours {NUMBER} rows/s "
                rf".*ceiling {NUMBER} rows/s, ratio {NUMBER}$",
                out,
                re.M,
            ), out
    for chunk_size in (1000, 5000, 10000, 50000):
        assert re.search(
            rf"^dblog dump in process, chunk {chunk_size}: {NUMBER} rows/s", out, re.M
        ), out
    for master in ("local[2]", "local[1]"):
        for parallelism in (1, 2):
            line = rf"^P2 direct {re.escape(master)} chunk 5000 parallelism {parallelism}: "
            assert re.search(line + rf"ours {NUMBER} rows/s .*tailer CPU {NUMBER} s", out, re.M)
            ratio = rf"^P2 direct {re.escape(master)} parallelism {parallelism}: ratio"
            assert re.search(ratio + rf" ours/ceiling {NUMBER}$", out, re.M), out
    assert re.search(rf"^P2 direct local\[2\]/local\[1\] parallelism 2: {NUMBER}$", out, re.M)
    assert re.search(
        rf"^P2 tailer CPU per million dumped rows: sequenced {NUMBER} s .*direct {NUMBER} s",
        out,
        re.M,
    ), out
    assert re.search(rf"^overhead per chunk -?{NUMBER} ms", out, re.M), out
    assert re.search(
        rf"^read psycopg \+ converters, mapPartitions, 2 part: {NUMBER} rows/s", out, re.M
    ), out
    assert re.search(r"^read Spark JDBC", out, re.M), out  # measured, or skipped with why


@pytest.mark.parametrize(("key", "vectors"), [("bigint", False), ("text", False), ("bigint", True)])
def test_lake_bench_quick_prints_fold_direct_and_sustained_figures(key: str, vectors: bool) -> None:
    options = ["--deletion-vectors"] if vectors else []
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_lake.py"), "--quick", "--key", key, *options],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    state = "on" if vectors else "off"
    heading = (
        rf"^sizes \[50000, 100000\], 2000 changes per fold, {key} keys, deletion vectors {state}"
    )
    assert re.search(heading, out), out
    for keys in ("random", "recent"):
        fold = (
            rf"^  F {keys} +fold \(driver\) of 2000 changes: {NUMBER} events/s .* "
            rf"{NUMBER} rows in removed files, (\d+) files marked"
        )
        marked = [int(m) for m in re.findall(fold, out, re.M)]
        assert len(marked) == 2, out  # one per table size
        assert all(marked) if vectors else not any(marked), out
        direct = rf"^  D {keys} +direct commit of {NUMBER} existing keys: {NUMBER} rows/s"
        assert len(re.findall(direct, out, re.M)) == 2, out
    assert re.search(rf"^ratios 100000 / 50000 rows: fold random driver {NUMBER}", out, re.M), out
    sustained = rf"^S sustained 2000 events/s .* freshness p50 {NUMBER} s p99 {NUMBER} s"
    assert re.search(sustained, out, re.M), out


@pytest.mark.parametrize("vectors", [False, True])
def test_lake_verify_bench_quick_prints_quiet_and_written_reads(vectors: bool) -> None:
    options = ["--deletion-vectors"] if vectors else []
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_lake_verify.py"), "--quick", *options],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    state = "on" if vectors else "off"
    assert re.search(
        rf"^20000 rows in \d+ data files, chunks of 2000, deletion vectors {state}", out
    )
    for label in ("Q quiet", "W under writes"):
        line = rf"^{label}: {NUMBER}(?:,\d+)* rows/s \({NUMBER} s, 20000 rows"
        assert re.search(line, out, re.M), out


def test_sustained_bench_quick_prints_each_run_on_both_databases() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_sustained.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^lag: the age of the oldest change committed but not yet durable", out, re.M)
    for label in ("no dump", "with dump"):  # the live ceiling beside each PostgreSQL run
        assert re.search(
            rf"^S postgres {label}: .*, pg_recvlogical lag p50 {NUMBER} s, worst {NUMBER} s",
            out,
            re.M,
        ), out
    for database in ("mariadb", "postgres"):
        for label in ("no dump", "with dump"):
            assert re.search(
                rf"^S {database} {label}: \d+ threads, --rate 200, {NUMBER} transactions/s, "
                rf"{NUMBER} events/s written, {NUMBER} events/s read, lag p50 {NUMBER} s, "
                rf"p99 {NUMBER} s, worst {NUMBER} s \(\d+ samples\), caught up {NUMBER} s after "
                rf"the load.*; load average {NUMBER} {NUMBER} {NUMBER}$",
                out,
                re.M,
            ), out
        assert re.search(
            rf"^S {database} no dump: .*, tailer CPU {NUMBER} us/event \(writer {NUMBER}\)",
            out,
            re.M,
        ), out
        assert re.search(
            rf"^S {database} with dump: .*, dump [\d,]+ rows \({NUMBER} rows/s, \d+ finished",
            out,
            re.M,
        ), out


def test_read_only_bench_quick_prints_both_modes_on_both_databases() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_read_only.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for database in ("postgres", "mariadb"):
        assert re.search(rf"^{database}\s+[\d,]+\s+[\d,]+\s+{NUMBER}$", out, re.M), out
    shares = rf"-?{NUMBER}; -?{NUMBER}; -?{NUMBER}"
    for where in ("primary", "replica"):
        found = re.findall(rf"^  reading the {where}: {shares}", out, re.M)
        assert len(found) == 2, out  # each database
    assert re.search(rf"^load average \(1, 5, 15 min\): {NUMBER} ", out, re.M), out


def test_verify_bench_quick_prints_each_check_and_the_ratios() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_verify.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    found = r"found \d+ of \d+ corrupted keys, \d+ other keys"
    assert re.search(rf"^V0 fill, sequenced dump: {NUMBER} rows/s", out, re.M), out
    for label in ("V1 verify equal", "L1 lake verify equal"):
        line = rf"^{label}: \d+ rows in {NUMBER} s, {NUMBER} rows/s, \d+ in flux, 0 keys differ$"
        assert re.search(line, out, re.M), out
    assert re.search(rf"^V1r reladiff equal: {NUMBER} rows/s .*, 0 keys differ$", out, re.M), out
    assert re.search(rf"^V1d direct dump: {NUMBER} rows/s", out, re.M), out
    assert re.search(rf"^V1p verify equal, parallelism 2: \d+ rows in {NUMBER} s", out, re.M)
    assert re.search(rf"^V1c read ceiling: {NUMBER} rows/s", out, re.M), out
    assert re.search(rf"^V2r reladiff corrupted: {NUMBER} rows/s, {found}$", out, re.M), out
    assert re.search(
        rf"^V2 verify corrupted with repair: {NUMBER} s, {found}; \d+ keys written, \d+ of them "
        r"not corrupted; then 0 keys differ$",
        out,
        re.M,
    ), out
    assert re.search(rf"^V3 full re-dump, sequenced: {NUMBER} rows/s", out, re.M), out
    for label in ("V4 verify under writes", "L2 lake verify corrupted", "L4 lake verify under"):
        assert re.search(rf"^{label}.* {NUMBER} rows/s, \d+ in flux, {found}", out, re.M), out
    assert re.search(rf"^V4r reladiff under writes: {NUMBER} rows/s, {found}; ", out, re.M), out
    assert re.search(rf"^L0 fill, direct dump into the lake: {NUMBER} rows/s", out, re.M), out
    if not re.search(r"^M pt-table-checksum skipped: ", out, re.M):  # measured, or why not
        for label in ("equal", "corrupted", "under writes"):
            assert re.search(rf"^M\d pt-table-checksum {label}: {NUMBER} rows/s", out, re.M), out
        assert re.search(rf"^M2 .*; pt-table-sync {NUMBER} s, {found}$", out, re.M), out
    assert re.search(rf"^R verify / reladiff rows/s: {NUMBER} \(goal >= 0.5\)$", out, re.M), out
    assert re.search(rf"^R verify / direct dump rows/s: {NUMBER} \(goal >= 0.7\)$", out, re.M)
    assert re.search(rf"^R verify / read ceiling rows/s: {NUMBER} ", out, re.M), out
    assert re.search(rf"^R verify\+repair / full re-dump time: {NUMBER} \(goal <= 0.5\)", out, re.M)
    assert re.search(rf"^load average \(1, 5, 15 min\) at the end: {NUMBER} ", out, re.M), out
