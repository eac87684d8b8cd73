import pytest

from cua_rl.http.serve import serve_app_in_thread
from tests.doubles.monitor_double import MonitorState, build_monitor_double


@pytest.fixture
def monitor_state():
    return MonitorState()


@pytest.fixture
def monitor_server(monitor_state):
    """The Training Monitor test double on a real loopback port; stopped after the test."""
    served = serve_app_in_thread(build_monitor_double(monitor_state))
    yield served
    served.stop()



# ---- our own Training Monitor (cua_rl.monitor.server) on real storage ----------------------------------
@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL cluster (Debian's package) in a temp dir, for the whole session; stopped after."""
    from pg_server import start_postgres

    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    """The run store's database: a SQLite file, or a fresh database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return None  # start_monitor's default: <data_dir>/monitor.db
    import uuid

    return request.getfixturevalue("postgres").create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def our_monitor(tmp_path, store_url):
    """Our Training Monitor on a loopback port over ``store_url``; yields (monitor, project token)."""
    from cua_rl.monitor.embedded import start_monitor

    monitor = start_monitor(tmp_path / "monitor", database_url=store_url, refresh_s=0.5)
    try:
        yield monitor, monitor.store.create_token("p1")
    finally:
        monitor.stop()
