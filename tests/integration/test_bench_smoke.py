"""`bench/bench_pipeline.py --quick` runs to the end and prints its three figures.

Only that the benchmark works is checked; its numbers are never compared with a threshold.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_pipeline.py"
NUMBER = r"\d+(?:\.\d+)?"


def test_bench_quick_prints_p1_p3_p4() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(
        rf"^P1 ours {NUMBER} events/s, ceiling {NUMBER} events/s .*ratio {NUMBER}", out, re.M
    ), out
    for label in ("no dump", "with dump"):
        assert re.search(
            rf"^P3 latency {label}: p50 -?{NUMBER} ms, p99 -?{NUMBER} ms", out, re.M
        ), out
    assert re.search(rf"^P4 peak RSS {NUMBER} MiB, baseline RSS {NUMBER} MiB", out, re.M), out
