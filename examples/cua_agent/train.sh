#!/usr/bin/env bash
# Train a computer-use agent with GRPO on AReaL. Prepares the Python environment (scripts/env.sh installs
# what is missing), then hands every argument to the launcher, which owns the flags: train.sh --help.
set -eo pipefail
export CUA_RL_APT="${CUA_RL_APT:-none}"   # no Debian packages here: the launcher installs the embedded stack's if the run is embedded
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
exec python -m cua_rl.run.launch "$@"
