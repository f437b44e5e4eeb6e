#!/usr/bin/env bash
# The project's checks, as CI runs them: lint, format, types, then every test (unit and
# integration on real servers started by the tests themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest "$@"
