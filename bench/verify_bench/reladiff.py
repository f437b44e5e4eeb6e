"""reladiff (PyPI, not a dependency of the project) in a venv of its own, `bench/.venv-reladiff`,
made on first use: its hashdiff of the bench table's source and SQL target, every column
compared (`-c %`), as a user runs it. Its differing keys are classed as verify classes them: a
key on both sides of its output changed, only in the source's rows missing, only in the
target's extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support import Env, say

from airflow_provider_dblog.core.verify import Difference
from verify_bench.corrupt import Found
from verify_bench.deployment import TARGET_DB

VERSION = "0.6.0"
VENV = Path(__file__).resolve().parents[1] / ".venv-reladiff"


def reladiff_binary() -> Path:
    """The venv's `reladiff`, installed if it is not yet."""
    binary = VENV / "bin" / "reladiff"
    if not binary.exists():
        say(f"installing reladiff {VERSION} into {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, f"reladiff[postgresql]=={VERSION}"], check=True)
    return binary


def reladiff(env: Env) -> tuple[float, Found]:
    """One hashdiff of the source's and the target's table; its seconds and the keys it found."""
    pg = env.pg
    base = f"postgresql://{pg.user}@{pg.host}:{pg.port}"
    command = [
        str(reladiff_binary()), f"{base}/{pg.dbname}", "public.vrows", f"{base}/{TARGET_DB}",
        "public.vrows", "-k", "id", "-c", "%", "-a", "hashdiff", "--json",
    ]  # fmt: skip
    # The password travels in libpq's variable; a wide console keeps rich from folding lines.
    environment = dict(os.environ, PGPASSWORD=pg.password, COLUMNS="100000", NO_COLOR="1")
    started = time.monotonic()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"bench: reladiff failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    sides: dict[int, set[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            op, values = json.loads(line)
            sides.setdefault(int(values[0]), set()).add(op)
    found: Found = set()
    for key, ops in sides.items():
        kind = Difference.CHANGED if len(ops) == 2 else None
        kind = kind or (Difference.MISSING if ops == {"-"} else Difference.EXTRA)
        found.add((kind, key))
    return seconds, found
