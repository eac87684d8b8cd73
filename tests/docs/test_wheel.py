"""Issue 35 item 3: the project as a library. The wheel is built from this checkout, installed (no
dependencies) into a fresh venv layered on the project's environment (a .pth line: AReaL, vLLM and the rest come
from there, the wheel's ``cua_rl`` from its own site-packages), and ``cua-train`` runs from an empty directory:
no clone on the path, the recipes and ``.env.example`` read as package data, ``./.env`` read as the user's.

The environment layering is the one set-up step a user on an existing AReaL environment does differently
(``pip install cua_rl-*.whl`` there); nothing else is stood in for.

Issue 64 item 3: a gym host installs without the trainer. The wheel goes into a venv of its own with its base
dependencies only (no ``train`` extra; scripts/requirements-gym.lock from uv's cache, the wheel's dependencies
checked by ``uv pip check``): no AReaL, torch, vLLM or Ray in it; its size is measured; ``cua-gym serve`` from it creates, plays,
evaluates and ends a real desktop, ``cua-agent serve`` answers, and ``cua-train`` says what to install."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from cua_rl import cua_rl_home
from tests.hosts import wait_http

ROOT = Path(__file__).resolve().parents[2]


def _sources(dest: Path) -> None:
    """This checkout's files as git sees them (tracked and new, not ignored), links kept: what a wheel is
    built from, without the clone's build outputs or egg-info."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue   # deleted in the work tree, not yet in the index
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    _sources(src)
    # the project's environment has setuptools and build: no download, no isolated build environment
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    [whl] = out.glob("cua_rl-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel in it, layered on the project's environment."""
    venv = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    uv = Path(cua_rl_home()) / "tools" / "bin" / "uv"   # what scripts/setup.sh installs packages with
    subprocess.run([str(uv), "pip", "install", "-q", "--offline", "--no-deps", "--python", str(venv / "bin" / "python"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_project_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", CUA_RL_DEVICE="cpu", HF_HUB_OFFLINE="1")
    for name in ("GYM_BASE_URL", "GYM_ID", "CUA_CONFIG"):   # the caller's own settings are not this test's
        env.pop(name, None)
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "cua_rl"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    missing = [f for f in tracked if (ROOT / f).exists() and f not in names]
    assert not missing, f"package files the wheel leaves out: {missing}"
    assert {"cua_rl/recipes/config.yaml", "cua_rl/recipes/config.multiturn.yaml", "cua_rl/recipes/.env.example",
            "cua_rl/local_gym/board.tcl"} <= names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "cua-train = cua_rl.run.entry:train" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_cua_train_dry_run_outside_a_clone(installed, tmp_path):
    empty = tmp_path / "work"
    empty.mkdir()
    where = _run(installed, empty, str(installed / "bin" / "python"), "-c", "import cua_rl; print(cua_rl.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(installed)), f"cua_rl imported from {where.stdout}: not the wheel's"

    proc = _run(installed, empty, "cua-train", "--dry-run", "--offline", "--gym", "http://10.77.9.9:5010",
                "--gym-id", "desktop")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mode: external gym http://10.77.9.9:5010" in proc.stdout
    recipes = f"{installed}/lib/python3.11/site-packages/cua_rl/recipes/config.cpu.yaml"
    assert f"config: {recipes} (default: no GPU found, your gym)" in proc.stdout, proc.stdout
    assert "gym_id=desktop" in proc.stdout
    assert list(empty.iterdir()) == [], "a dry run wrote into the user's directory"

    # the user's ./.env is read (installed, it is the one place: no clone's examples/cua_agent/.env), and a config
    # of their own, relative to their directory, starts from a packaged recipe (Hydra's pkg:// search path)
    (empty / ".env").write_text("GYM_BASE_URL=http://10.77.9.8:5010\nGYM_ID=from-dotenv\n")
    (empty / "mine.yaml").write_text("defaults:\n  - config.cpu\n  - _self_\nhydra:\n  searchpath:\n"
                                     "    - pkg://cua_rl.recipes\nmax_turns: 7\n")
    proc = _run(installed, empty, "cua-train", "--dry-run", "--offline", "--config", "mine.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mode: external gym http://10.77.9.8:5010" in proc.stdout and "gym_id=from-dotenv" in proc.stdout
    assert f"config: {empty / 'mine.yaml'} (given)" in proc.stdout


@pytest.fixture(scope="module")
def gym_host(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel and its base dependencies: a gym or agent host's install (no trainer). The
    gym lock is installed as it is, without resolving, as ``CUA_RL_PROFILE=gym scripts/setup.sh`` does (offline
    from uv's cache: a resolving install needs package metadata that setup's own install never caches, so it
    failed on a fresh machine); ``uv pip check`` then says whether the wheel's declared dependencies are all in it."""
    venv = tmp_path_factory.mktemp("gym-host")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    uv, python = Path(cua_rl_home()) / "tools" / "bin" / "uv", str(venv / "bin" / "python")
    env = {**os.environ, "UV_CACHE_DIR": str(Path(cua_rl_home()) / "uv-cache")}
    for what in (["-r", str(ROOT / "scripts" / "requirements-gym.lock")], [str(wheel)]):
        out = subprocess.run([str(uv), "pip", "install", "-q", "--offline", "--no-deps", "--python", python, *what],
                             capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
    check = subprocess.run([str(uv), "pip", "check", "--python", python], capture_output=True, text=True,
                           timeout=120, env=env)
    assert check.returncode == 0, (check.stdout + check.stderr)[-3000:]
    return venv


def _size_mib(path: Path) -> float:
    return sum(f.lstat().st_size for f in path.rglob("*") if not f.is_symlink() and f.is_file()) / 2**20


@pytest.mark.desktop
def test_a_gym_host_installs_and_serves_without_the_trainer(gym_host, tmp_path):
    from cua_rl.http.serve import free_port

    python = str(gym_host / "bin" / "python")
    found = _run(gym_host, tmp_path, python, "-c", "import importlib.util as u; print([m for m in "
                 "('areal', 'torch', 'vllm', 'ray', 'transformers', 'datasets') if u.find_spec(m)])")
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
    size = _size_mib(gym_host)
    print(f"gym host install: {size:.0f} MiB in {gym_host}")
    assert size < 400, f"the gym host's install is {size:.0f} MiB"

    refused = _run(gym_host, tmp_path, "cua-train", "--dry-run", "--gym", "http://10.77.9.9:5010")
    assert refused.returncode == 2 and "pip install 'cua_rl[train]'" in refused.stderr, refused.stderr

    gym_port, agent_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{gym_host / 'bin'}:{env['PATH']}"
    procs = [subprocess.Popen(["cua-gym", "serve", "--port", str(gym_port), "--max-executions", "2", "--pool-size",
                               "0", "--x-spares", "0", "--display-base", "760"], cwd=tmp_path, env=env,
                              stdout=open(tmp_path / "gym.log", "w"), stderr=subprocess.STDOUT),
             subprocess.Popen(["cua-agent", "serve", "--port", str(agent_port)], cwd=tmp_path, env=env,
                              stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT)]
    try:
        import httpx

        for proc, port, log in zip(procs, (gym_port, agent_port), ("gym.log", "agent.log")):
            wait_http(f"http://127.0.0.1:{port}/health", proc, tmp_path / log)
        api = f"http://127.0.0.1:{gym_port}/api/v1/desktop"
        assert httpx.get(f"{api}/capacity").json() == {"free": 2, "max": 2}
        eid = httpx.post(f"{api}/tasks/002", json={"options": {"seed": 3}}, timeout=60).json()["execution_id"]
        assert httpx.get(f"{api}/executions/{eid}/screenshot", timeout=30).content[:4] == b"\x89PNG"
        assert httpx.post(f"{api}/executions/{eid}/actions", json={"action": {"type": "key", "keys": ["r"]}},
                          timeout=60).json()["ok"]
        assert httpx.post(f"{api}/executions/{eid}/evaluate", json={}, timeout=60).json()["task_id"].startswith("002")
        httpx.post(f"{api}/executions/{eid}/terminate", json={}, timeout=60).raise_for_status()
        assert 'cua_gym_executions{state="running"} 0' in httpx.get(f"http://127.0.0.1:{gym_port}/metrics").text
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
    assert set(codes) <= {0, -signal.SIGTERM}, codes   # uvicorn re-raises the signal once it has shut down
