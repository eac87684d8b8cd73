"""The GPUs of the launching machine, as the launcher and scripts/setup.sh decide them.

``listed()``: how many GPUs ``nvidia-smi -L`` lists (its ``GPU i: ...`` lines); no ``nvidia-smi`` on the PATH, one
that fails or one that hangs counts 0. ``CUA_RL_DEVICE=cpu|gpu`` forces the CPU or the GPU path
(``cua_rl.run.launch.has_gpu``) whatever is listed; where ``gpu`` is forced and none is listed the count is unknown
(``present``: None), so the launcher neither fits nor checks the allocation there.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def listed() -> int:
    """The number of GPUs ``nvidia-smi -L`` lists; 0 without a working nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU"))


def forced() -> str | None:
    """``cpu`` or ``gpu`` when CUA_RL_DEVICE forces the device, else None (``auto``)."""
    value = os.environ.get("CUA_RL_DEVICE", "auto")
    return value if value in ("cpu", "gpu") else None


def present(gpu: bool) -> int | None:
    """The GPUs a run on this machine has: 0 on the CPU path, the listed count on the GPU path, None where
    CUA_RL_DEVICE=gpu forces the GPU path and nvidia-smi lists none (not counted)."""
    if not gpu:
        return 0
    count = listed()
    return None if count == 0 else count
