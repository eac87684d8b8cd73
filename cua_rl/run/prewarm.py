"""The trainer's process, started before the launcher knows its arguments, so that its imports overlap the
launcher's own start-up.

Why: ``python -m cua_rl.train`` spends about 12 s of one core importing AReaL, torch and transformers
before it reads its config, and the launcher spends about as long (it imports the same packages to load and
check the config) before it can start it. On a machine with a second core the two imports can run at once:
``Prewarmed.start`` launches ``python -m cua_rl.train --from-launcher`` at the launcher's first line; that
process imports everything, then waits for one JSON line on its stdin (``read_hand_over``): the trainer's
arguments and the environment variables that were not known yet. ``hand_over`` sends them once the launcher
has decided the run.

The environment is the one thing a running interpreter cannot take back: a module may read a variable when
it is imported. So the early process gets the environment the launcher predicts (``predicted_env``: its own,
the ``.env`` values, vLLM's CPU variables and the offline Hub switches of a CPU run), and the hand-over
carries only variables that nothing reads at import (``LATE_ENV``: the embedded monitor's, gym's and agent's
tokens). Variables that the imports themselves set (swanlab's and others', seen in the launcher's own environment) are set in
the early process by the same imports. Any other difference, or an early process that died, makes
``hand_over`` discard it and return None: the launcher then starts the trainer the ordinary way. Closing the launcher's end without a hand-over (the launcher failed or
was killed) makes the early process exit quietly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger("cua_rl.run.launch")

FLAG = "--from-launcher"
# Variables the trainer reads only after its hand-over (cua_rl.train main: resolve_project_token; the gym and agent
# clients read their tokens when they are made, per episode; vLLM's socket folder, which the launcher makes per run,
# when AReaL starts the vLLM servers: without it here every CPU run discarded its early process)
LATE_ENV = frozenset({"PROJECT_TOKEN", "CUA_GYM_TOKEN", "CUA_AGENT_TOKEN", "VLLM_RPC_BASE_PATH"})
# Set to "1" for a run that needs no Hugging Face Hub (launch._hub_access decides; predicted here)
HUB_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def predicted_env(environ: dict[str, str], gpu: bool) -> dict[str, str]:
    """The environment the launcher will give the trainer, as far as it is known before the config loads:
    the same additions as ``launch._prepare_cpu`` and ``launch._hub_access`` make on a machine without a GPU
    (on a GPU machine the Hub decision needs the config; a wrong guess only costs the early start)."""
    env = dict(environ)
    if not gpu:
        from cua_rl.local_model.vllm_server import CPU_ENV

        env.update(CPU_ENV)
        for name in HUB_OFFLINE:
            env.setdefault(name, "1")
    return env


class Prewarmed:
    """One early trainer process; ``hand_over`` it or ``discard`` it (both idempotent)."""

    def __init__(self, proc: subprocess.Popen, env: dict[str, str]) -> None:
        self.proc: subprocess.Popen | None = proc
        self.env = env
        self.set_by_imports: frozenset[str] = frozenset()   # what the launcher's own imports set (see above)

    @classmethod
    def start(cls, env: dict[str, str], cwd: Path) -> "Prewarmed":
        proc = subprocess.Popen([sys.executable, "-m", "cua_rl.train", FLAG], cwd=cwd, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        return cls(proc, env)

    def hand_over(self, args: list[str], env: dict[str, str]) -> subprocess.Popen | None:
        """Give the early process its arguments; None (and the process discarded) when it cannot take them."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        changed = {k for k, v in env.items() if self.env.get(k) != v} - self.set_by_imports
        gone = [k for k in self.env if k not in env]
        if proc.poll() is not None or gone or changed - LATE_ENV:
            logger.info("the early trainer process is not used (%s)",
                        f"exit code {proc.returncode}" if proc.poll() is not None
                        else f"environment differs: {sorted(changed - LATE_ENV) + gone}")
            _end(proc)
            return None
        late = {k: env[k] for k in changed}
        try:
            proc.stdin.write((json.dumps({"args": args, "env": late}) + "\n").encode())
            proc.stdin.close()
        except OSError:   # it died in between
            _end(proc)
            return None
        return proc

    def discard(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _end(proc)


def _end(proc: subprocess.Popen) -> None:
    from cua_rl.local_gym.procs import kill_group

    with contextlib.suppress(OSError):
        proc.stdin.close()        # EOF: it exits by itself once its imports are done
    kill_group(proc, grace_s=10)


def read_hand_over() -> list[str]:
    """In the early process (``cua_rl.train --from-launcher``), after its imports: its arguments, with the late
    environment applied. No hand-over (EOF): exit quietly."""
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)
    message = json.loads(line)
    os.environ.update(message["env"])
    return list(message["args"])
