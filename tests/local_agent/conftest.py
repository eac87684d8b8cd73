"""Fixtures of the agent-service tests: the real agent service and the real embedded gym on loopback,
plus the scripted model server (a documented test double for the policy, see ``tests/doubles/model_double.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_helpers import fast_settings
from cua_rl.http.serve import serve_app_in_thread
from cua_rl.local_agent import start_agent_server
from tests.doubles.model_double import ScriptedModel, build_model_app


@pytest.fixture
def model() -> Any:
    """(ScriptedModel, base URL ending in /v1) on a real loopback port."""
    scripted = ScriptedModel()
    served = serve_app_in_thread(build_model_app(scripted))
    yield scripted, served.url + "/v1"
    served.stop()


@pytest.fixture
def agent() -> Any:
    handle = start_agent_server(settings=fast_settings())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def gym() -> Any:
    """The real embedded gym (Xvfb desktops); one per test module to amortise start-up."""
    from cua_rl.local_gym import start_gym_server

    # Own display range: other gyms on a shared host (launcher runs, other suites) hold the default :300+.
    with start_gym_server(port=0, max_executions=6, display_base=700) as server:
        yield server
