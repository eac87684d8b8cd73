#!/usr/bin/env bash
# Regenerate the Python environment's lock files (scripts/requirements-{cpu,gpu,gym}.lock), which
# scripts/setup.sh installs exactly (no resolution at set-up time), so two machines set up a month apart
# get the same environment. Run after changing pyproject.toml's dependencies or scripts/uv-overrides.txt,
# and commit the result; tests/docs/test_lock.py fails while the lock and the environment disagree.
# uv keeps every pin already in a lock file that still satisfies the requirements (--upgrade to refresh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUA_RL_HOME="${CUA_RL_HOME:-$HOME/.cache/cua-rl}"
UV="$CUA_RL_HOME/tools/bin/uv"   # made by scripts/setup.sh
export UV_CACHE_DIR="$CUA_RL_HOME/uv-cache" UV_PYTHON_DOWNLOADS=never
for device in cpu gpu; do
  "$UV" pip compile -q "$ROOT/pyproject.toml" --extra train --extra test --extra "vllm-$device" \
    --override "$ROOT/scripts/uv-overrides.txt" --python-version 3.11 \
    --python-platform x86_64-unknown-linux-gnu --no-header --no-annotate "$@" \
    -o "$ROOT/scripts/requirements-$device.lock"
  echo "scripts/requirements-$device.lock: $(grep -c '==' "$ROOT/scripts/requirements-$device.lock") packages"
done
# A gym or agent host (CUA_RL_PROFILE=gym scripts/setup.sh): the base install alone, no trainer, each package at
# the version the CPU lock pins (one set of versions for the whole project).
"$UV" pip compile -q "$ROOT/pyproject.toml" --constraint "$ROOT/scripts/requirements-cpu.lock" \
  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header --no-annotate "$@" \
  -o "$ROOT/scripts/requirements-gym.lock"
echo "scripts/requirements-gym.lock: $(grep -c '==' "$ROOT/scripts/requirements-gym.lock") packages"
