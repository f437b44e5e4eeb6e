#!/usr/bin/env bash
# The project's checks, as CI runs them: lint, format, types, then every test (unit and
# integration on real servers started by the tests themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Two workers (pytest-xdist), a test file each at a time: most tests wait on servers, so two
# run in about two thirds of the time of one. DBLOG_TEST_WORKERS=0 runs them in this process.
exec .venv/bin/pytest -n "${DBLOG_TEST_WORKERS:-2}" --dist loadfile "$@"
