import pytest

from cua_rl.asgi_thread import serve_app_in_thread
from monitor_double import MonitorState, build_monitor_double


@pytest.fixture
def monitor_state():
    return MonitorState()


@pytest.fixture
def monitor_server(monitor_state):
    """The Training Monitor test double on a real loopback port; stopped after the test."""
    served = serve_app_in_thread(build_monitor_double(monitor_state))
    yield served
    served.stop()

