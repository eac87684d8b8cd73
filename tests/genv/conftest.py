import pytest

from cua_rl.http.serve import serve_app_in_thread
from tests.doubles.genv_double import GymState, build_gym_double


@pytest.fixture
def gym_state():
    return GymState()


@pytest.fixture
def gym_server(gym_state):
    """The genv test double on a real loopback port; stopped after the test."""
    served = serve_app_in_thread(build_gym_double(gym_state))
    yield served
    served.stop()

