"""Before an embedded run starts anything: the Debian binaries its gym needs, and whether this machine's sandbox
lets bubblewrap make the user namespaces every desktop runs in.

Why here and not in the gym: a missing ``wish`` or a container that forbids user namespaces otherwise shows up
minutes later as desktops that never start, after vLLM and the trainer have come up. ``train.sh`` installs no
Debian package itself (a run against your own gym needs none); when the run turns out to be embedded and a
binary is missing, the launcher runs ``scripts/setup.sh`` for that gym's packages alone (in a clone: a desktop
run gets no Chromium, QEMU or VNC), saying so first, or names the packages to install (installed from the
wheel), before anything starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# binary -> its Debian package (scripts/apt-packages.txt), per embedded gym
_DESKTOP = {"Xvfb": "xvfb", "openbox": "openbox", "bwrap": "bubblewrap", "dbus-run-session": "dbus"}
NEEDED = {
    "desktop": {**_DESKTOP, "mousepad": "mousepad", "pcmanfm": "pcmanfm", "xterm": "xterm", "wish": "tk"},
    "miniwob": {**_DESKTOP, "chromium": "chromium"},
}
USERNS_HELP = ("bubblewrap could not create a user namespace, which every desktop's sandbox needs. In Docker, the "
               "default seccomp profile forbids it: run the container with --security-opt seccomp=unconfined (or a "
               "profile that allows unshare and clone with CLONE_NEWUSER); on Ubuntu 24.04 and later AppArmor may "
               "forbid it: sysctl kernel.apparmor_restrict_unprivileged_userns=0; elsewhere check "
               "user.max_user_namespaces > 0")


class PreflightError(RuntimeError):
    """The embedded stack cannot start here; the message says what to change."""


def missing_binaries(gym_id: str, path: str | None = None) -> dict[str, str]:
    """The binaries ``gym_id`` needs that are not on ``path`` (default: PATH), with their Debian packages."""
    return {b: pkg for b, pkg in NEEDED.get(gym_id, NEEDED["desktop"]).items() if shutil.which(b, path=path) is None}


def user_namespace_error(path: str | None = None) -> str | None:
    """None when bubblewrap can make the namespaces a desktop's sandbox uses, else what it said."""
    bwrap = shutil.which("bwrap", path=path)
    if bwrap is None:
        return "bwrap is not installed"
    try:
        proc = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                               shutil.which("true") or "/bin/true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit code {proc.returncode}")


def check_embedded(gym_id: str, clone: Path | None, *, install: bool = True) -> list[str]:
    """Raise ``PreflightError`` naming what is missing; in a clone, first install this gym's Debian packages
    (``scripts/setup.sh`` with ``CUA_RL_APT=<gym id>``: the packages apt-packages.txt marks for it, nothing for
    the live view, VMs or the other gym) when a binary is missing and ``install``. It says so on the console
    before anything is installed; set-up names the packages on one line, then prints a line per step (apt's
    own output goes to its log). Returns what was done, for the log."""
    done = []
    missing = missing_binaries(gym_id)
    if missing and install and clone is not None:
        print(f"[cua-rl] preflight: the embedded {gym_id} gym needs {', '.join(sorted(missing))}, not installed: "
              f"installing the {gym_id} gym's Debian packages with scripts/setup.sh (apt-get, as root or with "
              f"sudo)", flush=True)
        done.append(f"installed the {gym_id} gym's Debian packages (missing: {', '.join(sorted(missing))})")
        proc = subprocess.run(["bash", str(clone / "scripts" / "setup.sh")],
                              env={**os.environ, "CUA_RL_APT": gym_id, "CUA_RL_APT_ONLY": "1"},
                              stdout=subprocess.DEVNULL)   # its progress (stderr) on the console, as it happens
        if proc.returncode != 0:
            raise PreflightError(f"scripts/setup.sh could not install the embedded {gym_id} gym's Debian packages "
                                 f"(exit code {proc.returncode}; its last lines are above)")
        missing = missing_binaries(gym_id)
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise PreflightError(f"the embedded {gym_id} gym needs {', '.join(sorted(missing))}, not found on PATH: "
                             f"install them (apt-get install {packages}), or train against your own gym with --gym URL")
    error = user_namespace_error()
    if error is not None:
        raise PreflightError(f"{USERNS_HELP} (bwrap said: {error})")
    return done
