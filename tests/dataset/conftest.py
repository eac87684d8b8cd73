import sys
from pathlib import Path

import pytest

# The genv gym TEST DOUBLE lives with the genv client tests; reuse it rather than keep a second one.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "genv"))

from cua_rl.http.serve import serve_app_in_thread  # noqa: E402
from genv_double import GymState, build_gym_double  # noqa: E402
from gym_tasks import numbered_tasks  # noqa: E402


@pytest.fixture
def gym_state():
    return GymState(tasks={"tasks": numbered_tasks()})


@pytest.fixture
def gym_server(gym_state):
    """The genv TEST DOUBLE (tests/genv/genv_double.py) on a real loopback port."""
    served = serve_app_in_thread(build_gym_double(gym_state))
    yield served
    served.stop()
