#!/usr/bin/env bash
# The project's checks, as CI runs them: lint, format, types, words, then every test (unit and
# integration on real servers started by the tests themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# No notes on how the work went (numbered rounds, sessions, issues) in code, tests or docs.
.venv/bin/python scripts/check_words.py
# The compiled modules' tests once more as plain Python: both forms must pass them.
DBLOG_PLAIN_PYTHON=1 .venv/bin/pytest -q -p no:cacheprovider -n 2 tests/unit/sources/postgres
# Two workers (pytest-xdist), a test file each at a time: most tests wait on servers, so two
# run in about two thirds of the time of one. DBLOG_TEST_WORKERS=0 runs them in this process.
exec .venv/bin/pytest -n "${DBLOG_TEST_WORKERS:-2}" --dist loadfile "$@"
