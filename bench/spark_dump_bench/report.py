"""How the Spark dump bench prints its figures: where a dump's CPU went, the direct dumps'
comparisons, and the table at the end."""

from __future__ import annotations

import os

from spark_dump_bench.results import SPANS, DumpRun, Report


def cpu_line(run: DumpRun) -> str:
    """Where a dump's CPU went, and how busy it kept the machine's cores."""
    assert run.cpu is not None
    c, cores = run.cpu, os.cpu_count() or 1
    return (
        f"CPU s: Spark tasks {c.tasks_s:.2f}, driver {c.driver_s:.2f}, PostgreSQL "
        f"{c.postgres_s:.2f}, Redis {c.redis_s:.2f}: {c.total_s:.2f} in {run.seconds:.2f} s, "
        f"{c.total_s / run.seconds / cores:.0%} of {cores} cores; tasks "
        f"{c.tasks_s / max(c.total_s, 1e-9):.0%} of it"
    )


def print_report(report: Report) -> None:
    lines = ["", f"{'figure':<62} {'value':>10}", "-" * 73]

    def add(label: str, value: float, rate: bool = False) -> None:
        lines.append(f"{label:<62} {f'{value:,.0f}' if rate else f'{value:.1f}':>10}")

    ceiling = report.ceiling
    if ceiling is not None:
        add("P2 ceiling: COPY TO STDOUT (rows/s)", ceiling.rate, rate=True)
    for run in report.dumps:
        add(f"P2 chunk {run.chunk_size} parallelism {run.parallelism} (rows/s)", run.rate, True)
        if ceiling is not None:
            lines.append(f"{'':<6}ratio ours/ceiling {run.rate / ceiling.rate:.4f}")
    for run in report.process_dumps:
        add(f"dblog dump in process, chunk {run.chunk_size} (rows/s)", run.rate, True)
    for run in report.direct:
        label = f"P2 direct {run.master} chunk {run.chunk_size} parallelism {run.parallelism}"
        add(f"{label} (rows/s)", run.rate, True)
        if ceiling is not None:
            lines.append(f"{'':<6}ratio ours/ceiling {run.rate / ceiling.rate:.4f}")
        add(f"{label}: tailer CPU (s per million rows)", run.tailer_cpu_per_million)
    for run in report.dumps:
        add(
            f"P2 chunk {run.chunk_size} parallelism {run.parallelism}: tailer CPU "
            "(s per million rows)",
            run.tailer_cpu_per_million,
        )
    o = report.overhead
    if o is not None:
        add(f"overhead per chunk, {o.small.run.chunk_size} vs {o.rows} rows (ms)", o.per_chunk_ms)
        for label, value in o.per_chunk_spans():
            add(f"  of which {label} (ms)", value)
    b = report.breakdown
    if b is not None:
        t, n = b.timed, max(1, b.measured_chunks)
        job_ms = t.mean_ms("job_start_ms", "job_end_ms")
        read_ms, append_ms = b.read_s / n * 1000, b.append_s / n * 1000
        add(f"breakdown: chunk {t.run.chunk_size}, 1 window, 1 task (rows/s)", t.run.rate, True)
        for label, start, end in SPANS:
            add(f"  per chunk: {label} (ms)", t.mean_ms(start, end))
        add("  per chunk: between chunks (ms)", t.between_ms() / max(1, len(t.chunks)))
        add("  apart: source read_chunk (ms/chunk)", read_ms)
        add("    its CPU time in this thread (ms/chunk)", b.read_cpu_s / n * 1000)
        add("    the query alone, nothing loaded (ms/chunk)", b.query_s / n * 1000)
        add("  apart: encode + Redis WindowStore.append_rows (ms/chunk)", append_ms)
        add("  so Spark's own share of the job (ms/chunk)", job_ms - read_ms - append_ms)
        fetch_ms, reconcile_ms = b.fetch_s / n * 1000, b.reconcile_s / n * 1000
        output_ms = b.output_write_s / max(1, t.run.chunks) * 1000
        add("  apart: Redis row_slices, the tailer's fetch (ms/chunk)", fetch_ms)
        add("  apart: Reconciler.chunk_page, pages to lines (ms/chunk)", reconcile_ms)
        add("  tailer: output writes, NDJSON encode + fsync (ms/chunk)", output_ms)
        add(
            "  so the rest of hw -> window closed (ms/chunk)",
            t.mean_ms("job_end_ms", "closed_ms") - fetch_ms - reconcile_ms - output_ms,
        )
    for path in report.read_paths:
        add(f"read {path.label} (rows/s)", path.rate, rate=True)
    if report.jdbc_skipped:
        lines.append(f"read Spark JDBC: skipped ({report.jdbc_skipped})")
    lines.append(
        f"load average (1, 5, 15 min) {report.load_start} at the start, {report.load_end} at "
        f"the end, on {os.cpu_count()} CPUs: other work on the machine skews every figure"
    )
    print("\n".join(lines))


def print_direct_summary(report: Report) -> None:
    """The direct figures against COPY, local[2] against local[1], and the tailer's CPU per
    million dumped rows direct against sequenced."""
    ceiling = report.ceiling
    by_master = {(run.master, run.parallelism): run for run in report.direct}
    for (master, parallelism), run in sorted(by_master.items()):
        if ceiling is not None:
            print(
                f"P2 direct {master} parallelism {parallelism}: ratio ours/ceiling "
                f"{run.rate / ceiling.rate:.4f}"
            )
        one = by_master.get(("local[1]", parallelism))
        if master == "local[2]" and one is not None:
            print(
                f"P2 direct local[2]/local[1] parallelism {parallelism}: {run.rate / one.rate:.2f}"
            )
    sequenced = max(report.dumps, key=lambda r: (r.chunk_size, r.parallelism), default=None)
    direct = by_master.get(("local[2]", sequenced.parallelism)) if sequenced else None
    if sequenced is not None and direct is not None:
        print(
            "P2 tailer CPU per million dumped rows: sequenced "
            f"{sequenced.tailer_cpu_per_million:.2f} s (chunk {sequenced.chunk_size} parallelism "
            f"{sequenced.parallelism}), direct {direct.tailer_cpu_per_million:.2f} s (chunk "
            f"{direct.chunk_size} parallelism {direct.parallelism})"
        )
