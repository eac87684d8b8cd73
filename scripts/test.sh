#!/usr/bin/env bash
# The test command: installs what is missing (idempotent), then runs the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/genv -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
start=$(date +%s)
set +e
python -m pytest -ra "$@"
rc=$?
set -e
echo "[test] pytest finished in $(( $(date +%s) - start )) s with exit code $rc"
exit $rc
