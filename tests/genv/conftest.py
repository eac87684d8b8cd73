import pytest

from cua_rl.asgi_thread import serve_app_in_thread
from genv_double import GymState, build_gym_double


@pytest.fixture
def gym_state():
    return GymState()


@pytest.fixture
def gym_server(gym_state):
    """The genv test double on a real loopback port; stopped after the test."""
    served = serve_app_in_thread(build_gym_double(gym_state))
    yield served
    served.stop()


@pytest.fixture
def caplog(caplog):
    """caplog that also sees cua_rl loggers orphaned by AReaL: ``areal.utils.logging.getLogger`` replaces
    the stdlib root and logger manager on every call, so a ``cua_rl`` module imported after areal logs to
    a detached WARNING-level root that pytest never hears. Attach the capture handler to every cua_rl
    module logger directly, at DEBUG, and restore them afterwards."""
    import logging
    import sys

    loggers = [m.logger for name, m in list(sys.modules.items())
               if name.startswith("cua_rl") and isinstance(getattr(m, "logger", None), logging.Logger)]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(caplog.handler)
        lg.setLevel(logging.DEBUG)
    yield caplog
    for lg, level in saved:
        lg.removeHandler(caplog.handler)
        lg.setLevel(level)
