"""Shared fixtures: one tiny checkpoint per session, a real server (in-process thread) on loopback."""

from __future__ import annotations

import pytest
from cua_rl.local_model import build_tiny, start_model_server


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def served(tiny_dir):
    """The real HTTP server in a background thread (torch threads left alone: they are per process)."""
    srv = start_model_server(tiny_dir)
    yield srv
    srv.stop()
