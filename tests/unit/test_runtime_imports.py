"""What Airflow and the `dblog` command load must not pull in the throwaway servers or the demo:
they are imported only when `dblog dev-services` or `dblog demo` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from airflow_provider_dblog.cli import dev_services
from airflow_provider_dblog.devservices import stack

REPO = Path(__file__).resolve().parents[2]
RUNTIME_MODULES = (
    "airflow_provider_dblog.get_provider_info",
    "airflow_provider_dblog.hooks.dblog",
    "airflow_provider_dblog.operators.dblog",
    "airflow_provider_dblog.triggers.dblog",
    "airflow_provider_dblog.sensors.dblog",
    "airflow_provider_dblog.tailer",
    "airflow_provider_dblog.cli",
)
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from airflow_provider_dblog.cli import build_parser
help_text = build_parser().format_help()
loaded = sorted(m for m in sys.modules if m.startswith("airflow_provider_dblog."))
print(json.dumps({"loaded": loaded, "help": help_text}))
"""


def test_runtime_modules_and_the_cli_parser_import_no_devservices_and_no_demo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *RUNTIME_MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    loaded = result["loaded"]
    assert "airflow_provider_dblog.hooks.dblog" in loaded  # the probe imported what it names
    forbidden = [
        m
        for m in loaded
        if m.startswith(("airflow_provider_dblog.devservices", "airflow_provider_dblog.demo"))
    ]
    assert forbidden == []
    for verb in ("demo", "tail", "dump", "status", "pause", "resume", "cancel", "throttle"):
        assert verb in result["help"]
    assert "dev-services" in result["help"]


def test_the_cli_offers_the_postgres_flavours_devservices_knows() -> None:
    assert dev_services.POSTGRES_FLAVOURS == stack.POSTGRES_FLAVOURS


def test_the_cli_and_the_tailer_load_no_lake_library() -> None:
    """pyarrow and deltalake (the `lake` extra) cost a process about 80 MiB: the tailer and
    the `dblog` command load them only when a dump writes a lake."""
    probe = (
        "import sys, airflow_provider_dblog.cli, airflow_provider_dblog.tailer; "
        "print(sorted(m for m in ('pyarrow', 'deltalake', 'pyspark') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
