#!/usr/bin/env bash
# Runs pytest arguments N times in a row while K busy loops load the CPU; stops at the first failure.
# Used to show that a once-flaky test passes under load (docs/testing.md, "Flakes"):
#   bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_env.py
#   bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_miniwob.py -k scripted
#   bash scripts/repeat_under_load.sh 20 2 tests/local_gym/test_vm_gym.py -k genv_api
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
times="${1:?how many runs}" hogs="${2:?how many CPU hogs}"; shift 2
source scripts/env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled   # as scripts/test.sh
pids=()
for _ in $(seq "$hogs"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
start=$(date +%s)
for i in $(seq "$times"); do
  t0=$(date +%s)
  if ! python -m pytest -q -p no:cacheprovider "$@" >"/tmp/repeat_under_load.$i.log" 2>&1; then
    echo "[repeat] run $i of $times FAILED (log /tmp/repeat_under_load.$i.log):"
    tail -n 30 "/tmp/repeat_under_load.$i.log"
    exit 1
  fi
  echo "[repeat] run $i of $times passed in $(( $(date +%s) - t0 )) s ($(tail -n 1 "/tmp/repeat_under_load.$i.log"))"
done
echo "[repeat] $times of $times passed with $hogs CPU hogs in $(( $(date +%s) - start )) s: $*"
