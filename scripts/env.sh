# Source this file: runs the idempotent set-up, then activates the shared environment for this clone.
_cua_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_cua_venv="$(bash "$_cua_root/scripts/setup.sh")" || return 1 2>/dev/null || exit 1
# shellcheck disable=SC1091
source "$_cua_venv/bin/activate"
# This clone's code first, for this shell and everything it starts: the environment is shared by every clone on
# the machine and its editable link follows whichever clone ran set-up last (tests/config/test_two_clones.py).
export PYTHONPATH="$_cua_root${PYTHONPATH:+:$PYTHONPATH}"
# Defaults only: a value the user set (their shell, .env) wins. Whether the Hugging Face Hub may be reached
# is the launcher's decision (offline unless the model is a Hub id on a GPU machine: cua_rl/run/launch.py);
# W&B follows the config's stats_logger.wandb.mode.
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}" \
       TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
unset _cua_root _cua_venv
