#!/usr/bin/env bash
# Runs the selected tests N times in a row, in one pytest process (--keep-duplicates), while K busy loops load
# the CPU; stops at the first failure. Used to show that a once-flaky test passes under load (docs/testing.md,
# "Flakes"):
#   bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_env.py
#   CUA_MINIWOB_TASKS=enter-text-2 bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_miniwob.py -k scripted
#   bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_vm_gym.py -k genv_api
# Give test files (pytest keeps duplicate files, not duplicate node ids) and, to pick tests, -k after them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
times="${1:?how many runs}" hogs="${2:?how many CPU hogs}"; shift 2
source scripts/env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled   # as scripts/test.sh
pids=()
# each hog ends with this script even when it is killed (a hog once outlived its script by an hour)
for _ in $(seq "$hogs"); do (while kill -0 $$ 2>/dev/null; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
files=() opts=()
while (($#)); do
  case "$1" in -k|-m) opts+=("$1" "$2"); shift 2;; -*) opts+=("$1"); shift;; *) files+=("$1"); shift;; esac
done
args=()
for _ in $(seq "$times"); do args+=("${files[@]}"); done
args+=("${opts[@]}")
start=$(date +%s)
log=/tmp/repeat_under_load.log
if python -m pytest -q -p no:cacheprovider -x --keep-duplicates "${args[@]}" >"$log" 2>&1; then
  echo "[repeat] $times x ${files[*]} ${opts[*]}: passed with $hogs CPU hogs in $(( $(date +%s) - start )) s ($(grep -E 'passed' "$log" | tail -n 1))"
else
  echo "[repeat] FAILED with $hogs CPU hogs (log $log):"
  tail -n 40 "$log"
  exit 1
fi
