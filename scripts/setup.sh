#!/usr/bin/env bash
# Set up a fresh machine for DBLog development, tests and the demo:
# Debian packages (PostgreSQL 15, MariaDB, Redis, Java 17), then a virtualenv in .venv with the
# package installed in editable mode with its dev extra. Idempotent; fast when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-system-deps.sh

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/pip install --quiet --upgrade pip
fi
# The tested versions: constraints-3.11.txt pins every package (scripts/lock.sh refreshes it).
LOCK=constraints-3.11.txt
python_version=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "$python_version" != "3.11" ]; then
    echo "setup: the tested versions are locked for Python 3.11, not $python_version" \
        "(set PYTHON to a 3.11 interpreter)" >&2
    exit 1
fi
if ! .venv/bin/python -c "import airflow_provider_dblog, pyspark, airflow, hypothesis, deltalake, duckdb" 2>/dev/null \
    || [ pyproject.toml -nt .venv/.installed ] || [ "$LOCK" -nt .venv/.installed ]; then
    .venv/bin/pip install --quiet --constraint "$LOCK" -e ".[dev]"
    touch .venv/.installed
fi
.venv/bin/python scripts/check_lock.py
# The log reader's hot path compiled with mypyc (rebuilt when its sources changed).
.venv/bin/python scripts/compile.py >/dev/null
# pyspark-client installs into pyspark/ too: the Python side must match the bundled jars.
.venv/bin/python - <<'PY'
import pathlib, pyspark
jars = pathlib.Path(pyspark.__file__).parent / "jars"
core = [p.name for p in jars.glob("spark-core_*.jar")]
assert core and core[0].endswith(f"-{pyspark.__version__}.jar"), (
    f"pyspark {pyspark.__version__} does not match its jars {core}: reinstall with matching "
    "pyspark and pyspark-client versions"
)
PY
echo "setup: ok (.venv ready; run '.venv/bin/dblog --help')"
