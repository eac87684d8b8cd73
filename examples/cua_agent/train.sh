#!/usr/bin/env bash
# Train a computer-use agent with GRPO on AReaL.
#
#   ./examples/cua_agent/train.sh                         # embedded stack on this machine
#   ./examples/cua_agent/train.sh --gym URL --gym-id ID   # your own gym server (and agent service)
#   ./examples/cua_agent/train.sh --dry-run ...           # print what would run, run nothing
#
# Translates flags (and their environment variables, and .env files) into Hydra overrides of
# config.yaml, then execs `python -m cua_rl.launch --config CONFIG [--embedded] -- OVERRIDES...`.
# Precedence: flags > process environment > <repo>/.env > examples/cua_agent/.env > config file.
set -euo pipefail

EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$EXAMPLE_DIR/../.." && pwd)"

usage() {
  cat <<'EOF'
Usage: train.sh [FLAGS] [key=value ...]

Without --gym (and without GYM_BASE_URL) the embedded stack runs on this machine: a gym with X11
desktops, the agent service and, without a GPU, a CPU server for a tiny model.
Each flag has an environment variable (also read from examples/cua_agent/.env and <repo>/.env).

  --gym URL                        gym server base URL (genv API)              GYM_BASE_URL
  --gym-id ID                      gym id on that server                       GYM_ID
  --gbox-mini-url URL              agent service URL (gbox-mini-agent API)     GBOX_MINI_AGENT_BASE_URL
      (alias --gbox-mini-agent-base-url)
  --gbox-agent NAME                agent prompt format: qwen3-vl | mai-ui      GBOX_AGENT
  --standard-action-space NAME     pc | mobile                                 STANDARD_ACTION_SPACE
  --model-base-url URL             send the agent to this model instead of     MODEL_BASE_URL
      (alias --inference-base-url)   the policy endpoint (no training data)
  --model-name NAME                model name for --model-base-url             MODEL_NAME
  --monitor-base-url URL           Training Monitor URL (empty: send nothing)  MONITOR_BASE_URL
  --project-id ID                  Training Monitor project                    PROJECT_ID
  --project-token TOKEN            Training Monitor token (environment only,   PROJECT_TOKEN
                                     never on a command line or in a file)
  --batch-size N                   tasks per step (train and eval)             BATCH_SIZE
  --max-turns N                    agent turns per episode                     MAX_TURNS
  --max-task-time SECONDS          time limit of one episode                   MAX_TASK_TIME
  --max-step-time SECONDS          time limit of one turn                      MAX_STEP_TIME
  --max-concurrent-rollouts N      episodes in flight                          MAX_CONCURRENT_ROLLOUTS
  --gym-train-ratio R              train share when splitting by ratio         GYM_TRAIN_RATIO
  --gym-seed N                     seed of the split and the limit sample      GYM_SEED
  --gym-limit N                    at most N tasks per split                   GYM_LIMIT
  --gym-tags a,b                   keep tasks having any of these tags         GYM_TAGS
  --gym-eval-number-range 001-032  eval split by task number (beats ratio)     GYM_EVAL_NUMBER_RANGE
  --config FILE                    config file (default: config.yaml with a    CUA_CONFIG
                                     GPU; without: config.learn.yaml for the
                                     embedded stack, config.cpu.yaml with --gym)
  --dry-run                        print the command and overrides, run nothing
  -h, --help                       this help

Other arguments are Hydra overrides passed through unchanged, e.g. actor.optimizer.lr=1e-6
or task_source.kind=file task_source.task_file=/path/tasks.jsonl (keys missing from the config
file need a leading '+'). `--` ends the flags.
EOF
}

die() { echo "train.sh: $*" >&2; exit 2; }

# --- .env files: KEY=value lines, read as data (never executed); set variables are exported ------
declare -A PRESET=()
while IFS= read -r name; do PRESET[$name]=1; done < <(compgen -e)

load_env_file() {
  local file=$1 n=0 line key val
  [[ -f $file ]] || return 0
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
    [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] \
      || die "$file:$n: expected KEY=value"
    key=${BASH_REMATCH[2]} val=${BASH_REMATCH[3]}
    if [[ $val =~ ^\"(.*)\"[[:space:]]*$ || $val =~ ^\'(.*)\'[[:space:]]*$ ]]; then
      val=${BASH_REMATCH[1]}
    else
      val=${val%%[[:space:]]#*}                       # trailing " # comment"
      val=${val%"${val##*[![:space:]]}"}              # trailing blanks
    fi
    [[ -z $val || -n ${PRESET[$key]:-} ]] && continue  # empty = unset; the process environment wins
    export "$key=$val"
  done <"$file"
}
load_env_file "$EXAMPLE_DIR/.env"
load_env_file "$ROOT/.env"                            # later file wins

# --- flags (they beat the environment) -----------------------------------------------------------
DRY_RUN=0
PASSTHROUGH=()
while (($#)); do
  arg=$1
  if [[ $arg == --*=* ]]; then set -- "${arg%%=*}" "${arg#*=}" "${@:2}"; arg=$1; fi
  case $arg in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1; shift; continue ;;
    --) shift; PASSTHROUGH+=("$@"); break ;;
    --gym|--gym-id|--gbox-mini-url|--gbox-mini-agent-base-url|--gbox-agent|--standard-action-space|\
    --model-base-url|--inference-base-url|--model-name|--monitor-base-url|--project-id|--project-token|\
    --batch-size|--max-turns|--max-task-time|--max-step-time|--max-concurrent-rollouts|--gym-train-ratio|\
    --gym-seed|--gym-limit|--gym-tags|--gym-eval-number-range|--config)
      (($# >= 2)) || die "$arg needs a value (see --help)"
      val=$2; shift 2 ;;
    -*) die "unknown flag '$arg'. Run train.sh --help for the flags; Hydra overrides are key=value without dashes." ;;
    *=*) PASSTHROUGH+=("$arg"); shift; continue ;;
    *) die "unexpected argument '$arg': overrides look like key=value (see --help)" ;;
  esac
  case $arg in
    --gym) GYM_BASE_URL=$val ;;
    --gym-id) GYM_ID=$val ;;
    --gbox-mini-url|--gbox-mini-agent-base-url) GBOX_MINI_AGENT_BASE_URL=$val ;;
    --gbox-agent) GBOX_AGENT=$val ;;
    --standard-action-space) STANDARD_ACTION_SPACE=$val ;;
    --model-base-url|--inference-base-url) MODEL_BASE_URL=$val ;;
    --model-name) MODEL_NAME=$val ;;
    --monitor-base-url) MONITOR_BASE_URL=$val ;;
    --project-id) PROJECT_ID=$val ;;
    --project-token) PROJECT_TOKEN=$val ;;
    --batch-size) BATCH_SIZE=$val ;;
    --max-turns) MAX_TURNS=$val ;;
    --max-task-time) MAX_TASK_TIME=$val ;;
    --max-step-time) MAX_STEP_TIME=$val ;;
    --max-concurrent-rollouts) MAX_CONCURRENT_ROLLOUTS=$val ;;
    --gym-train-ratio) GYM_TRAIN_RATIO=$val ;;
    --gym-seed) GYM_SEED=$val ;;
    --gym-limit) GYM_LIMIT=$val ;;
    --gym-tags) GYM_TAGS=$val ;;
    --gym-eval-number-range) GYM_EVAL_NUMBER_RANGE=$val ;;
    --config) CUA_CONFIG=$val ;;
  esac
done

# --- overrides -----------------------------------------------------------------------------------
# A Hydra string value: bare when it is plainly a string, else single-quoted (commas would make a
# sweep, "007" or "true" would stop being strings, spaces and brackets would not parse).
hydra_str() {
  local v=$1
  if [[ $v =~ ^[A-Za-z_/][A-Za-z0-9_./:@%+-]*$ && ! $v =~ ^(true|false|null|True|False|None|nan|inf)$ ]]; then
    printf '%s' "$v"
  else
    v=${v//\\/\\\\}
    printf "'%s'" "${v//\'/\\\'}"
  fi
}
OVERRIDES=()
set_str() { [[ -n ${!1:-} ]] && OVERRIDES+=("$2=$(hydra_str "${!1}")"); return 0; }
set_int() {  # VAR key [min]
  local v=${!1:-}
  [[ -z $v ]] && return 0
  [[ $v =~ ^[0-9]+$ ]] && ((10#$v >= ${3:-1})) || die "$1 / its flag must be an integer >= ${3:-1}, got '$v'"
  OVERRIDES+=("$2=$((10#$v))")
}
set_str GYM_BASE_URL gym_base_url
set_str GYM_ID gym_id
set_str GBOX_MINI_AGENT_BASE_URL gbox_mini_agent_base_url
set_str GBOX_AGENT gbox_mini_agent_agent
set_str STANDARD_ACTION_SPACE gbox_mini_agent_standard_action_space
set_str MODEL_BASE_URL model_base_url
set_str MODEL_NAME model_name
set_str MONITOR_BASE_URL monitor_base_url
set_str PROJECT_ID project_id
# PROJECT_TOKEN is not an override: AReaL writes the resolved config into the run directory and
# argv is visible to every user of the machine. launch.py inherits it through the environment.
set_int BATCH_SIZE train_dataset.batch_size
set_int BATCH_SIZE valid_dataset.batch_size
set_int MAX_TURNS max_turns
set_int MAX_TASK_TIME max_task_time_seconds
set_int MAX_STEP_TIME max_turn_time_seconds
set_int MAX_CONCURRENT_ROLLOUTS rollout.max_concurrent_rollouts
if [[ -n ${GYM_TRAIN_RATIO:-} ]]; then
  [[ $GYM_TRAIN_RATIO =~ ^(0(\.[0-9]*)?|1(\.0*)?|\.[0-9]+)$ ]] \
    || die "GYM_TRAIN_RATIO / --gym-train-ratio must be a number in [0, 1], got '$GYM_TRAIN_RATIO'"
  OVERRIDES+=("gym_train_ratio=$GYM_TRAIN_RATIO")
fi
set_int GYM_SEED gym_seed 0
set_int GYM_LIMIT gym_limit
if [[ -n ${GYM_TAGS:-} ]]; then
  tags=()
  IFS=',' read -r -a raw_tags <<<"$GYM_TAGS"
  for t in "${raw_tags[@]}"; do
    t=${t//[[:space:]]/}
    [[ -z $t ]] && continue
    [[ $t =~ ^[A-Za-z0-9_.:-]+$ ]] || die "GYM_TAGS / --gym-tags: bad tag '$t' (letters, digits, _ . : - only)"
    tags+=("$(hydra_str "$t")")
  done
  ((${#tags[@]})) && OVERRIDES+=("gym_tags=[$(IFS=,; echo "${tags[*]}")]")
fi
if [[ -n ${GYM_EVAL_NUMBER_RANGE:-} ]]; then
  [[ $GYM_EVAL_NUMBER_RANGE =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] \
    || die "GYM_EVAL_NUMBER_RANGE / --gym-eval-number-range: expected e.g. 001-032 or 1-8,12, got '$GYM_EVAL_NUMBER_RANGE'"
  OVERRIDES+=("gym_eval_number_range=$(hydra_str "$GYM_EVAL_NUMBER_RANGE")")
fi
OVERRIDES+=("${PASSTHROUGH[@]}")   # last: the user's own overrides win over the flags

# --- mode and config -----------------------------------------------------------------------------
# Embedded unless a gym URL comes from a flag, the environment or an override. (A gym URL inside a
# custom --config file is seen by launch.py, which decides with CUAConfig.embedded_enabled.)
EMBEDDED=1
GYM_FROM=${GYM_BASE_URL:-}
gym_re="^[+]{0,2}gym_base_url=(.*)$"
for o in "${PASSTHROUGH[@]}"; do
  if [[ $o =~ $gym_re ]]; then GYM_FROM=${BASH_REMATCH[1]}; fi
done
[[ -n $GYM_FROM && $GYM_FROM != "''" && $GYM_FROM != '""' ]] && EMBEDDED=0
if [[ -n ${CUA_CONFIG:-} ]]; then
  CONFIG=$CUA_CONFIG why="given"
elif [[ ${CUA_RL_DEVICE:-auto} == gpu ]] || { [[ ${CUA_RL_DEVICE:-auto} == auto ]] && command -v nvidia-smi >/dev/null 2>&1 \
      && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  CONFIG=$EXAMPLE_DIR/config.yaml why="default: a GPU is present"
elif ((EMBEDDED)); then
  CONFIG=$EXAMPLE_DIR/config.learn.yaml why="default: no GPU found, embedded stack: the learning recipe"
else
  CONFIG=$EXAMPLE_DIR/config.cpu.yaml why="default: no GPU found, your gym"
fi
[[ -f $CONFIG ]] || die "config file not found: $CONFIG"
CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"

CMD=(python -m cua_rl.launch --config "$CONFIG")
((EMBEDDED)) && CMD+=(--embedded)
CMD+=(-- "${OVERRIDES[@]}")

# Values of keys that name secrets are shown as ****.
mask() {
  local a=$1 key=${1%%=*}
  if [[ $a == *=* && ${key##*.} =~ (^|_)(token|api_key|apikey|secret|password)$ ]]; then
    printf '%s=****' "$key"
  else
    printf '%s' "$a"
  fi
}

for o in "${PASSTHROUGH[@]}"; do
  [[ $(mask "$o") != "$o" ]] && echo "train.sh: warning: ${o%%=*} given as an override lands in argv and in the" \
    "run's saved config.yaml; prefer the environment (e.g. PROJECT_TOKEN in .env)" >&2
done

if ((DRY_RUN)); then
  echo "train.sh --dry-run: nothing is started"
  if ((EMBEDDED)); then
    echo "mode: embedded stack (no --gym / GYM_BASE_URL)"
  else
    echo "mode: external gym $GYM_FROM"
  fi
  echo "config: $CONFIG ($why)"
  echo "overrides:"
  for o in "${OVERRIDES[@]}"; do echo "  $(mask "$o")"; done
  [[ -n ${PROJECT_TOKEN:-} ]] && echo "environment: PROJECT_TOKEN=**** (the monitor token; never an override)"
  masked=()
  for a in "${CMD[@]}"; do masked+=("$(mask "$a")"); done
  echo "command (in $ROOT, after sourcing scripts/env.sh):"
  line=$(printf '%q ' "${masked[@]}")
  echo "  ${line% }"
  exit 0
fi

[[ -f $EXAMPLE_DIR/cua_rl/launch.py ]] \
  || die "examples/cua_agent/cua_rl/launch.py is missing: the launcher has not been built yet"
cd "$ROOT"
[[ -n ${PROJECT_TOKEN:-} ]] && export PROJECT_TOKEN
set +u  # the venv's activate script is not written for `set -u`
# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh"
set -u
exec "${CMD[@]}"
