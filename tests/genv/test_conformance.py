"""``cua-gym check URL --gym-id ID`` (cua_rl/genv/conformance.py, issue 84): a gym author's conformance probe of
docs/protocols.md §1.8. Real HTTP on loopback: our gym (one real desktop execution) passes; a plain file server
fails; the genv double playing a third-party gym passes when it does what §1.8 asks, and fails naming the check
when one route is missing or bad input is answered 200."""

from __future__ import annotations

import pytest

from cua_rl.http.serve import serve_app_in_thread
from cua_rl.local_gym.__main__ import main as cua_gym
from tests.doubles.genv_double import GymState, build_gym_double

ALL = ["tasks", "task", "create", "execution", "screenshot", "action", "bad action", "evaluate", "terminate",
       "unknown task", "unknown execution"]


def check(capsys, url: str, gym_id: str) -> tuple[int, dict[str, str], str]:
    """``cua-gym check`` in process: (exit code, check name -> its line's rest, the closing line)."""
    rc = cua_gym(["check", url, "--gym-id", gym_id])
    lines = capsys.readouterr().out.splitlines()
    found = {line.split(": ", 2)[1]: line.split(": ", 2)[2] for line in lines if line.startswith("check: ")}
    return rc, found, lines[-1]


@pytest.fixture
def third_party():
    """The genv double as a third-party gym that refuses what it does not know (its state, its URL)."""
    state = GymState(refuse_unknown=True)
    served = serve_app_in_thread(build_gym_double(state))
    yield state, served.url
    served.stop()


@pytest.mark.desktop
def test_our_gym_passes_every_check_with_its_token(capsys, monkeypatch):
    from cua_rl.local_gym import start_gym_server

    with start_gym_server(port=0, pool_size=0, x_spares=0, max_executions=2, token="gym-secret") as gym:
        monkeypatch.setenv("CUA_GYM_TOKEN", "gym-secret")
        rc, found, last = check(capsys, gym.url, "desktop")
        assert rc == 0, (found, last)
        assert list(found) == ALL and all(v.startswith("ok") for v in found.values()), found
        assert found["bad action"] == "ok (HTTP 422)" and found["unknown execution"] == "ok (HTTP 404)"
        assert not gym.manager.executions, "the check left an execution running"
        monkeypatch.delenv("CUA_GYM_TOKEN")
        rc, found, last = check(capsys, gym.url, "desktop")
        assert rc == 1 and found["tasks"].startswith("FAILED: HTTP 401: needs a token (CUA_GYM_TOKEN)"), found


def test_a_file_server_fails(capsys, file_server):
    rc, found, last = check(capsys, file_server, "desktop")
    assert rc == 1
    assert found["tasks"] == 'FAILED: HTTP 404: an HTML page, not a JSON {"detail": ...}: not a genv gym', found
    assert found["create"] == "not run: no task to play"
    assert last == (f"the gym at {file_server} (gym id desktop) fails 3 of 11 checks: tasks, unknown task, "
                    "unknown execution"), last


def test_a_third_party_gym_passes_and_a_half_broken_one_fails_naming_the_check(capsys, third_party):
    state, url = third_party
    rc, found, last = check(capsys, url, "g1")
    assert rc == 0 and list(found) == ALL, (found, last)
    assert state.terminated == ["exec-1"]
    state.missing = {"evaluate"}   # one route missing
    rc, found, last = check(capsys, url, "g1")
    assert rc == 1 and found["evaluate"] == "FAILED: HTTP 404: Not Found", found
    assert last.endswith("fails 1 of 11 checks: evaluate"), last
    assert state.terminated[-1] == "exec-2"   # ended all the same
    state.missing, state.accept_bad_actions = set(), True   # bad input answered 200
    rc, found, last = check(capsys, url, "g1")
    assert rc == 1 and found["bad action"].startswith("FAILED: an action of an unknown type was accepted (2xx"), found
    assert last.endswith("fails 1 of 11 checks: bad action"), last
