"""Fixtures for the local gym tests: one real gym server (real Xvfb desktops) per test module."""

from __future__ import annotations

import os
import shutil

import pytest

from gym_helpers import bare_x

NEEDED = ("Xvfb", "openbox", "bwrap", "mousepad", "pcmanfm", "xterm", "dbus-run-session")


def desktop_tools_missing() -> list[str]:
    return [tool for tool in NEEDED if shutil.which(tool) is None]


def pytest_collection_modifyitems(config, items):
    missing = desktop_tools_missing()
    if not missing:
        return
    # Not silently green: the skip names what is missing (scripts/setup.sh installs it).
    marker = pytest.mark.skip(reason=f"desktop packages missing: {missing}; run scripts/setup.sh")
    for item in items:
        if "desktop" in item.keywords and "local_gym" in str(item.fspath):
            item.add_marker(marker)


@pytest.fixture(scope="module")
def gym():
    from cua_rl.local_gym import start_gym_server

    workers = int(os.environ.get("CUA_GYM_TEST_CONCURRENCY", "4"))
    with start_gym_server(port=0, max_executions=max(6, workers + 2), pool_size=0) as server:
        yield server


@pytest.fixture
def x_display():
    """A bare Xvfb (320x200) of its own: its display name."""
    with bare_x() as name:
        yield name
