# Source this file: runs the idempotent set-up, then activates the shared environment for this clone.
_cua_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_cua_venv="$(bash "$_cua_root/scripts/setup.sh")" || return 1 2>/dev/null || exit 1
# shellcheck disable=SC1091
source "$_cua_venv/bin/activate"
# Offline-friendly defaults: nothing here may reach a model hub or telemetry endpoint.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True \
       WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
unset _cua_root _cua_venv
