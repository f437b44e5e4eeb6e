#!/usr/bin/env bash
# Refresh the tested versions: resolve pyproject.toml's ranges (every extra) to the newest
# releases for Python 3.11 on Linux into constraints-3.11.txt, print what moved, then run the
# whole test command on them. Commit the lock only when the tests pass.
#   bash scripts/lock.sh             newest releases within pyproject's ranges
#   bash scripts/lock.sh keep        only what pyproject's change needs (after editing a range)
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=constraints-3.11.txt
upgrade=(--upgrade)
if [[ "${1:-}" == "keep" ]]; then upgrade=(); fi

[ -x .venv/bin/uv ] || bash scripts/setup.sh
before=$(mktemp)
grep -E '^[A-Za-z0-9_.-]+==' "$LOCK" 2>/dev/null | sort >"$before" || true

.venv/bin/uv pip compile pyproject.toml --extra dev --python-version 3.11 --python-platform linux \
    --no-header --annotation-style line "${upgrade[@]}" --quiet --output-file "$LOCK.new"
{
    echo "# The tested versions for Python 3.11 on Linux: every dependency and extra of"
    echo "# pyproject.toml, resolved by uv. scripts/setup.sh installs from this file;"
    echo "# refresh it with 'bash scripts/lock.sh' (see CONTRIBUTING.md)."
    cat "$LOCK.new"
} >"$LOCK"
rm "$LOCK.new"

echo "lock: what changed in $LOCK"
diff "$before" <(grep -E '^[A-Za-z0-9_.-]+==' "$LOCK" | sort) | grep -E '^[<>]' || echo "  nothing"
rm "$before"

bash scripts/test.sh "${@:2}"
