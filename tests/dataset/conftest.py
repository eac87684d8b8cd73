import pytest

from cua_rl.http.serve import serve_app_in_thread
from gym_tasks import numbered_tasks
from tests.doubles.genv_double import GymState, build_gym_double  # the genv client tests' double, reused


@pytest.fixture
def gym_state():
    return GymState(tasks={"tasks": numbered_tasks()})


@pytest.fixture
def gym_server(gym_state):
    """The genv TEST DOUBLE (tests/doubles/genv_double.py) on a real loopback port."""
    served = serve_app_in_thread(build_gym_double(gym_state))
    yield served
    served.stop()
