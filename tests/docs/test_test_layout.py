"""``tests/`` mirrors ``cua_rl/`` (issue 87 item 2, after verl's check of its own tests' layout): every folder under
``tests/`` is a room of the package, ``cua_rl/<room>/`` or ``cua_rl/<room>.py``, holding that room's tests, or one
of the few folders that belong to no room, each named below with why. A test of the launcher is found in
``tests/run/``, of the trainer in ``tests/trainer/``; a catch-all folder (``tests/training/`` held the trainer's,
the credit's, the evaluation's and AReaL's extensions' tests) cannot come back unnoticed. Light: directories only,
nothing imported."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The folders under tests/ that name no room of cua_rl/, and why each stands apart.
NOT_ROOMS = {
    "docs": "checks over the whole repository: docs against code, the import graph, test helpers and this layout, "
            "the lock, the wheel, closed sets",
    "e2e": "whole train.sh runs (the e2e marker): a run crosses every room",
    "bad_input": "the malformed-request corpora of every service, tallied together by the folder's conftest.py",
    "doubles": "stand-ins for services outside cua_rl (genv gyms, gbox-mini-agent, model servers, the monitor)",
}


def rooms(package: Path) -> set[str]:
    """The package's rooms: its subpackages and its top-level modules."""
    return ({p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
            | {p.stem for p in package.glob("*.py") if p.stem != "__init__"})


def misplaced(tests: Path, package: Path) -> list[str]:
    """What breaks the mirror: a folder that is neither a room nor in NOT_ROOMS, or a test module outside a folder."""
    known = rooms(package)
    found = [f"tests/{d.name}/: no cua_rl/{d.name}/ or cua_rl/{d.name}.py (a test belongs in its room's folder)"
             for d in sorted(tests.iterdir())
             if d.is_dir() and not d.name.startswith((".", "__")) and d.name not in known | NOT_ROOMS.keys()]
    found += [f"tests/{f.name}: a test module outside a room's folder" for f in sorted(tests.glob("test_*.py"))]
    return found


def test_every_test_folder_is_a_room_of_the_package_or_named_apart():
    assert not misplaced(REPO / "tests", REPO / "cua_rl"), "\n".join(misplaced(REPO / "tests", REPO / "cua_rl"))


def test_the_layout_check_finds_a_catch_all_folder_and_a_loose_test(tmp_path):
    package, tests = tmp_path / "cua_rl", tmp_path / "tests"
    for room in ("trainer", "run"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "verdict.py").write_text("")
    for folder in ("trainer", "verdict", "docs", "training", "__pycache__"):
        (tests / folder).mkdir(parents=True)
    (tests / "test_loose.py").write_text("")
    assert misplaced(tests, package) == [
        "tests/training/: no cua_rl/training/ or cua_rl/training.py (a test belongs in its room's folder)",
        "tests/test_loose.py: a test module outside a room's folder"]


def test_every_folder_named_apart_exists_and_is_no_room():
    """A name in NOT_ROOMS that became a room, or whose folder is gone, is a stale exception."""
    assert {d for d in NOT_ROOMS if (REPO / "tests" / d).is_dir()} == NOT_ROOMS.keys()
    assert not NOT_ROOMS.keys() & rooms(REPO / "cua_rl")
