"""The package's imports have no circle and none runs back up the floors (scripts/import_graph.py, which CI
runs here in the quick tier), and the checker counts what Python really runs: imports inside functions yes,
imports under ``TYPE_CHECKING`` no, ``from pkg import mod`` also runs ``pkg/__init__``. Each rule is shown
firing on a small tree written by the test."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "import_graph.py"


def graph(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True,
                          timeout=60)


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``cua_rl`` under ``tmp_path`` with ``files`` (path under it -> source); every folder gets an
    empty ``__init__.py`` unless one is given."""
    package = tmp_path / "cua_rl"
    for rel, source in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(source)
    for folder in [package, *package.rglob("*")]:
        if folder.is_dir() and not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    return tmp_path


def test_the_package_has_no_import_circle_and_every_import_points_down():
    result = graph(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import circle, every import points down" in result.stdout


def test_a_circle_through_a_function_level_import_fails(tmp_path):
    root = tree(tmp_path, {"run/a.py": "from cua_rl.run import b\n",
                           "run/b.py": "def f():\n    from cua_rl.run import a\n"})
    result = graph(root)
    assert result.returncode == 1
    assert "cycle: cua_rl.run.a, cua_rl.run.b" in result.stdout


def test_an_import_under_type_checking_does_not_count(tmp_path):
    root = tree(tmp_path, {"run/a.py": "from cua_rl.run import b\n",
                           "run/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from cua_rl.run import a\n"})
    result = graph(root)
    assert result.returncode == 0, result.stdout


def test_importing_a_module_runs_its_packages_init(tmp_path):
    # config -> workflow.tally looks harmless, but it runs workflow/__init__, which imports group -> config
    root = tree(tmp_path, {"config.py": "from cua_rl.workflow import tally\n",
                           "workflow/__init__.py": "from .group import X\n",
                           "workflow/group.py": "from cua_rl.config import Y\nX = 1\n",
                           "workflow/tally.py": ""})
    result = graph(root)
    assert result.returncode == 1
    assert "cycle: cua_rl.config, cua_rl.workflow, cua_rl.workflow.group" in result.stdout


def test_an_import_back_up_the_floors_fails(tmp_path):
    root = tree(tmp_path, {"http/client.py": "def f():\n    from cua_rl.run import launch\n",
                           "run/launch.py": ""})
    result = graph(root)
    assert result.returncode == 1
    assert "cua_rl.http.client:2 -> cua_rl.run.launch (function)" in result.stdout


def test_a_group_not_on_any_floor_fails(tmp_path):
    root = tree(tmp_path, {"newroom/x.py": ""})
    result = graph(root)
    assert result.returncode == 1
    assert "group cua_rl.newroom is not placed on a floor" in result.stdout
