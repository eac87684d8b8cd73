"""cua-rl: train computer-use agents with GRPO on AReaL (the package of examples/cua_agent)."""

import os

__version__ = "0.1.0"


def cua_rl_home(environ: dict | None = None) -> str:
    """Where the project keeps what it builds once per machine (tiny models, kept warm starts):
    ``$CUA_RL_HOME``, default ``~/.cache/cua-rl`` (scripts/setup.sh uses the same default)."""
    env = os.environ if environ is None else environ
    return env.get("CUA_RL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "cua-rl")
