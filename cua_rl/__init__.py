"""cua-rl: train computer-use agents with GRPO on AReaL (the package of examples/cua_agent)."""

import os
import sys
from pathlib import Path

__version__ = "0.1.0"


def cua_rl_home(environ: dict | None = None) -> str:
    """Where the project keeps what it builds once per machine (tiny models, kept warm starts):
    ``$CUA_RL_HOME``, default ``~/.cache/cua-rl`` (scripts/setup.sh uses the same default)."""
    env = os.environ if environ is None else environ
    return env.get("CUA_RL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "cua-rl")


def own_command(script: str, module: str) -> str:
    """One of our commands as it works from a fresh shell, whose PATH may lack this environment (the hints a run
    prints): the console script by its full path, else the module under this interpreter."""
    path = Path(sys.executable).parent / script
    return str(path) if path.is_file() else f"{sys.executable} -m {module}"
