"""Issue 35 item 4: the embedded stack's preflight (cua_rl/run/preflight.py) names a missing binary and its
Debian package, and a sandbox without user namespaces, before anything starts; train.sh asks set-up for no
Debian package (the launcher installs the embedded gym's only when the run is embedded). Issue 62: only that
gym's packages, named on the console before apt runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cua_rl.run import preflight


def _path_without(tmp_path: Path, *left_out: str) -> str:
    """A PATH of one directory linking every binary the embedded gyms need, but ``left_out``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for needed in preflight.NEEDED.values():
        for binary in needed:
            if binary not in left_out and not (bin_dir / binary).exists():
                (bin_dir / binary).symlink_to(shutil.which(binary))
    return str(bin_dir)


def test_every_binary_is_found_here_and_a_missing_one_is_named_with_its_package(tmp_path):
    assert preflight.missing_binaries("desktop") == {} and preflight.missing_binaries("miniwob") == {}
    path = _path_without(tmp_path, "wish", "chromium")
    assert preflight.missing_binaries("desktop", path) == {"wish": "tk"}
    assert preflight.missing_binaries("miniwob", path) == {"chromium": "chromium"}


def test_user_namespaces_work_here_and_a_sandbox_that_forbids_them_is_explained(tmp_path, monkeypatch):
    assert preflight.user_namespace_error() is None
    # STAND-IN for bwrap in a container whose seccomp profile forbids CLONE_NEWUSER: what bwrap then prints
    fake = tmp_path / "fake" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert "No permissions" in preflight.user_namespace_error(str(fake.parent))
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    with pytest.raises(preflight.PreflightError, match="seccomp=unconfined.*No permissions"):
        preflight.check_embedded("desktop", None)


def test_installed_without_a_clone_a_missing_binary_names_the_apt_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_without(tmp_path, "wish"))
    with pytest.raises(preflight.PreflightError, match=r"needs wish.*apt-get install tk"):
        preflight.check_embedded("desktop", None)


def test_dry_run_reports_the_preflight_of_an_embedded_run(launcher, tmp_path, monkeypatch):
    rc, report, _, _ = launcher([])
    assert rc == 0 and report["preflight"].startswith("ok")
    monkeypatch.setenv("PATH", _path_without(tmp_path, "wish"))
    rc, report, _, _ = launcher([])
    assert rc == 0 and report["preflight"] == "missing wish (Debian: tk; a run installs them in a clone)"
    rc, report, _, _ = launcher(["--gym", "http://10.1.1.2:5010"])    # your gym: no preflight
    assert rc == 0 and "preflight" not in report


def test_train_sh_asks_set_up_for_no_debian_package_and_the_tests_for_theirs():
    root = Path(__file__).resolve().parents[2]
    assert 'export CUA_RL_APT="${CUA_RL_APT:-none}"' in (root / "examples/cua_agent/train.sh").read_text()
    assert 'export CUA_RL_APT="${CUA_RL_APT:-test}"' in (root / "scripts/test.sh").read_text()
    runtime = (root / "scripts/apt-packages.txt").read_text().split()
    for needed in preflight.NEEDED.values():          # every package the preflight names is one set-up installs
        assert set(needed.values()) <= set(runtime)
    assert "postgresql" not in runtime and "postgresql" in (root / "scripts/apt-packages-test.txt").read_text()


# What scripts/setup.sh needs on PATH to pick and install Debian packages (CUA_RL_APT_ONLY=1 stops after that).
SETUP_TOOLS = ("bash", "dirname", "mkdir", "flock", "cat", "grep", "awk", "tr", "sort", "date", "tail", "id", "cp",
               "ln", "true")
DESKTOP_PACKAGES = {"python3", "python3-venv", "xvfb", "x11-utils", "x11-xserver-utils", "xdotool", "openbox",
                    "bubblewrap", "dbus", "dbus-x11", "procps", "curl", "mousepad", "pcmanfm", "xterm",
                    "fonts-dejavu-core", "tk"}


def test_a_desktop_run_installs_only_its_gyms_packages_and_names_them_before_apt_runs(tmp_path):
    """The preflight of a desktop run on a machine without ``wish``, through the real scripts/setup.sh. STAND-INS
    for Debian's package tools, since real ones would install on this machine: ``dpkg-query`` finds nothing
    installed; ``apt-get`` records its arguments and what the console showed when it ran, and "installs" tk by
    linking the real ``wish``. Before: setup.sh ran with CUA_RL_APT=embedded, all of apt-packages.txt (Chromium,
    QEMU, noVNC: 164 packages with dependencies on a fresh machine), its output captured until apt had finished."""
    root = Path(__file__).resolve().parents[2]
    bin_dir = Path(_path_without(tmp_path, "wish"))
    tools, fakes, record = tmp_path / "tools", tmp_path / "fakes", tmp_path / "apt.record"
    tools.mkdir()
    fakes.mkdir()
    for tool in SETUP_TOOLS:
        (tools / tool).symlink_to(shutil.which(tool))
    (fakes / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (fakes / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {record}\n'
        f'cp "$CONSOLE" {record}.console-at-"$1"\n'
        f'case "$*" in *" tk"*) ln -s {shutil.which("wish")} {bin_dir}/wish ;; esac\n')
    for fake in fakes.iterdir():
        fake.chmod(0o755)
    console = tmp_path / "console.txt"
    env = {"PATH": f"{fakes}:{bin_dir}:{tools}", "CUA_RL_HOME": str(tmp_path / "home"), "CONSOLE": str(console),
           "HOME": str(tmp_path)}
    check = ("import json, sys; from pathlib import Path; from cua_rl.run import preflight; "
             "print(json.dumps(preflight.check_embedded('desktop', Path(sys.argv[1]))))")
    with open(console, "w") as out:
        proc = subprocess.run([sys.executable, "-c", check, str(root)], env=env, stdout=out, stderr=subprocess.STDOUT,
                              cwd=root, timeout=120)
    text = console.read_text()
    assert proc.returncode == 0, text
    calls = record.read_text().splitlines()
    assert calls[0] == "update -qq" and calls[1].startswith("install -y -qq --no-install-recommends "), calls
    installed = set(calls[1].split()[4:])
    assert installed == DESKTOP_PACKAGES, installed ^ DESKTOP_PACKAGES
    # said before apt ran: the preflight's line naming what is missing, then set-up's line naming every package
    before = (tmp_path / "apt.record.console-at-update").read_text().splitlines()
    assert before[0].startswith("[cua-rl] preflight: the embedded desktop gym needs wish, not installed"), before
    assert before[1].startswith("[setup] Debian packages to install for desktop (17): "), before
    assert set(before[1].split(": ", 1)[1].split()) == DESKTOP_PACKAGES
    assert "[setup] installing the 17 Debian packages" in text and text.rstrip().endswith(
        "missing: wish)\"]"), text


def test_the_gyms_packages_are_the_ones_their_binaries_come_from():
    """apt-packages.txt marks each package with what needs it; every binary the preflight checks for a gym comes
    from a package marked for that gym."""
    root = Path(__file__).resolve().parents[2]
    marked: dict[str, set[str]] = {}
    for line in (root / "scripts/apt-packages.txt").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, needed_by = line.split()
            for gym in needed_by.split(","):
                marked.setdefault(gym, set()).add(name)
    assert set(marked) == {"desktop", "miniwob", "live", "vm"}
    for gym, needed in preflight.NEEDED.items():
        assert set(needed.values()) <= marked[gym], (gym, set(needed.values()) - marked[gym])
    assert not marked["desktop"] & {"chromium", "qemu-system-x86", "x11vnc", "novnc", "websockify"}
