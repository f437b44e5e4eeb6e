"""The figures the Spark dump bench measures, as each part returns them, and the report that
collects them for the table at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_dump_bench.cpu_meter import CpuSplit


@dataclass
class DumpRun:
    chunk_size: int
    parallelism: int
    tasks: int
    rows: int
    chunks: int
    seconds: float
    tailer_cpu_s: float = 0.0
    """CPU seconds the tailer's threads used while the dump ran."""
    master: str = "local[2]"
    cpu: CpuSplit | None = None
    """Where the CPU went while the dump ran (direct dumps)."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def tailer_cpu_per_million(self) -> float:
        return self.tailer_cpu_s / max(1, self.rows) * 1_000_000


@dataclass
class Ceiling:
    rows: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@dataclass
class ChunkTimes:
    """One chunk of the instrumented dump: epoch ms of each step (the window's from Redis's
    clock, the reader's from this process's clock: the same machine)."""

    window_id: str
    rows: int
    registered_ms: float = 0.0
    job_start_ms: float = 0.0
    job_end_ms: float = 0.0
    closed_ms: float = 0.0


SPANS = (
    ("register + lw", "registered_ms", "job_start_ms"),
    ("Spark job (read + append)", "job_start_ms", "job_end_ms"),
    ("hw -> window closed", "job_end_ms", "closed_ms"),
)


@dataclass
class TimedRun:
    """A Spark dump with each chunk's steps timed (`TimedReader` and the window states)."""

    run: DumpRun
    chunks: list[ChunkTimes]

    def span_ms(self, start: str, end: str) -> float:
        """The span summed over the chunks."""
        return float(sum(getattr(c, end) - getattr(c, start) for c in self.chunks))

    def mean_ms(self, start: str, end: str) -> float:
        return self.span_ms(start, end) / max(1, len(self.chunks))

    def between_ms(self) -> float:
        """The run's time outside its chunks' windows: planning, controls, progress, counters."""
        return self.run.seconds * 1000 - self.span_ms("registered_ms", "closed_ms")


@dataclass
class Overhead:
    rows: int
    small: TimedRun
    large: TimedRun

    @property
    def extra_chunks(self) -> int:
        return self.small.run.chunks - self.large.run.chunks

    @property
    def per_chunk_ms(self) -> float:
        return (self.small.run.seconds - self.large.run.seconds) * 1000 / self.extra_chunks

    def per_chunk_spans(self) -> list[tuple[str, float]]:
        """The same difference, step by step: the fixed cost of each step of a chunk."""
        spans = [
            (label, (self.small.span_ms(a, b) - self.large.span_ms(a, b)) / self.extra_chunks)
            for label, a, b in SPANS
        ]
        between = (self.small.between_ms() - self.large.between_ms()) / self.extra_chunks
        return [*spans, ("between chunks", between)]


@dataclass
class Breakdown:
    timed: TimedRun
    output_write_s: float
    output_events: int
    read_s: float
    read_cpu_s: float
    """This thread's CPU time in read_chunk: less skewed by a crowded machine than wall time."""
    query_s: float
    append_s: float
    fetch_s: float
    reconcile_s: float
    measured_chunks: int
    measured_rows: int


@dataclass
class ReadPath:
    label: str
    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@dataclass
class Report:
    ceiling: Ceiling | None = None
    dumps: list[DumpRun] = field(default_factory=list)
    direct: list[DumpRun] = field(default_factory=list)
    process_dumps: list[DumpRun] = field(default_factory=list)
    overhead: Overhead | None = None
    breakdown: Breakdown | None = None
    read_paths: list[ReadPath] = field(default_factory=list)
    jdbc_skipped: str | None = None
    load_start: str = ""
    load_end: str = ""
