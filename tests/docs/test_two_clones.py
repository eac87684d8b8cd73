"""Two clones on one machine share one Python environment (scripts/setup.sh builds it once, keyed by the lock);
its editable link follows whichever clone ran set-up last. Each clone must still run its own code: a shell that
sourced clone A's scripts/env.sh imports A's ``cua_rl`` and runs A's console scripts whatever clone B's set-up did
since (issue 86 item 3). env.sh puts its clone first on PYTHONPATH, which every process the shell starts inherits.

The test clones this repository (a local clone: no network, no second environment build), marks the clone's
package so that importing it says so, runs the clone's set-up (which relinks the shared environment to it) from a
shell where this clone's env.sh was sourced, and asks that shell which ``cua_rl`` it imports and runs. Whatever
happens, this clone's set-up runs last, so the environment's link is this clone's again.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "CUA-RL-CLONE-B-IMPORTED"


def _bash(script: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``script`` in a fresh bash, in ``cwd`` (not a clone: ``python -c`` would import the clone it stands in)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def test_a_shell_runs_its_own_clones_code_after_another_clone_ran_its_set_up(tmp_path):
    b = tmp_path / "clone-b"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(b)], check=True, timeout=120)
    init = b / "cua_rl" / "__init__.py"
    init.write_text(init.read_text() + f"\nimport sys as _s\nprint({MARK!r}, file=_s.stderr)\n")
    try:
        done = _bash(f"""
            source '{ROOT}/scripts/env.sh' >/dev/null || exit 3
            bash '{b}/scripts/setup.sh' >/dev/null || exit 4
            cat "$(dirname "$(dirname "$(command -v python)")")/.source"
            python -c 'import cua_rl; print(cua_rl.__file__)'
            cua-gym --help >/dev/null
        """, tmp_path)
    finally:   # the shared environment's link back to this clone, whatever happened
        relinked = _bash(f"bash '{ROOT}/scripts/setup.sh' >/dev/null", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    source, imported = done.stdout.split()[0], done.stdout.split()[-1]
    assert source == str(b), f"clone B's set-up did not relink the environment (it says {source}): nothing was tried"
    assert imported == str(ROOT / "cua_rl" / "__init__.py"), f"the shell of clone A imported {imported}"
    assert MARK not in done.stderr, "a console script of clone A's shell ran clone B's code:\n" + done.stderr
    assert relinked.returncode == 0, relinked.stderr
