#!/usr/bin/env bash
# The test command: installs what is missing (idempotent), then runs the suite.
#   scripts/test.sh              the whole suite (what CI runs through .ci/run, in two lanes; about 29 minutes on 2 cores)
#   scripts/test.sh --quick      the quick tier while working: no vLLM, no trainer, no browser suite (4 minutes)
# Other arguments go to pytest, e.g. scripts/test.sh tests/genv -x. Every run ends with the slowest tests,
# the time per test folder (docs/testing.md keeps the ledger) and the wall time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
args=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then args+=(-m "not slow"); else args+=("$a"); fi
done
export CUA_RL_APT="${CUA_RL_APT:-test}"   # the embedded stack's Debian packages and the tests' own
source scripts/env.sh
# The tests never reach a model hub or a telemetry endpoint (the machines that run them may have no route).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
echo "[test] set-up took $(( $(date +%s) - start )) s"
# Two pytest-xdist workers where the machine has two cores or more: a runs lane (vLLM, trainers, training runs, at
# nice 5) and a desktops lane beside it (tests/conftest.py LaneScheduling; docs/testing.md "Two lanes").
# CUA_RL_TEST_LANES=1 runs everything in one process, in order.
lanes="${CUA_RL_TEST_LANES:-$([ "$(nproc)" -ge 2 ] && echo 2 || echo 1)}"
lane_args=()
[ "$lanes" -gt 1 ] && lane_args=(-n "$lanes" --no-loadscope-reorder)
echo "[test] $lanes lane(s)"
# The linter first (pyproject.toml's [tool.ruff]): a second, and what it finds fails the run before any test.
python -m ruff check --no-cache cua_rl tests bench scripts
set +e
python -m pytest -ra --durations=25 "${lane_args[@]}" "${args[@]}"
rc=$?
set -e
# pytest exits 5 when no test was selected: that is a failure of the command, not a pass.
echo "[test] finished in $(( $(date +%s) - start )) s of wall time (set-up included), pytest's exit code $rc"
exit $rc
