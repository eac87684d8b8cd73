"""Issue 35 item 4: the embedded stack's preflight (cua_rl/run/preflight.py) names a missing binary and its
Debian package, and a sandbox without user namespaces, before anything starts; train.sh asks set-up for no
Debian package (the launcher installs the embedded stack's only when the run is embedded)."""

from __future__ import annotations

import os
import shutil
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
