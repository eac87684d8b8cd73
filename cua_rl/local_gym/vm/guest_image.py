"""The tiny Linux test guest (``scripts/build_vm_test_image.sh``), built on first use and rebuilt when the
script changes: the VM tests, the VM bench and ``examples/vm_tasks`` run on it.

Why built, not shipped: it is made offline from this machine's Debian packages (kernel, busybox,
qemu-guest-agent) in a few seconds, so no image has to be stored or downloaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build_vm_test_image.sh"
FILES = ("base.qcow2", "vmlinuz", "initrd.gz")
ENV = "CUA_RL_VM_TEST_GUEST"   # where examples/vm_tasks look for it


def default_dir() -> Path:
    home = os.environ.get("CUA_RL_HOME") or os.path.expanduser("~/.cache/cua-rl")
    return Path(home) / "vm-test-guest"


def ensure(folder: Path | None = None) -> Path:
    """The guest's folder with ``FILES``, built (once, under a lock) when missing or older than the script."""
    folder = Path(folder or default_dir())
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]
    stamp = folder / ".script-sha256"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest and all((folder / f).is_file() for f in FILES):
            return folder
        done = subprocess.run(["bash", str(SCRIPT), str(folder)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"building the VM test guest failed: {done.stderr.strip()[-800:]}")
        stamp.write_text(digest)
    return folder
