import pytest

from cua_rl.http.serve import serve_app_in_thread
from tests.doubles.agent_double import AgentState, build_agent_double


@pytest.fixture
def agent_state():
    return AgentState()


@pytest.fixture
def agent_server(agent_state):
    """The gbox-mini-agent test double on a real loopback port; stopped after the test."""
    served = serve_app_in_thread(build_agent_double(agent_state))
    yield served
    served.stop()

