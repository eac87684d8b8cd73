"""``cua-agent check URL --gym URL --gym-id ID`` (cua_rl/mini_agent/conformance.py, issue 84): an agent author's
conformance probe of docs/protocols.md §2.8, a short run and a cancelled one against a scripted model the check
serves itself. Real servers on loopback: our agent service and our gym (real desktops) pass; a plain file server
as the agent fails naming the checks; a missing agent token is named."""

from __future__ import annotations

from cua_rl.local_agent import start_agent_server
from cua_rl.local_agent.__main__ import main as cua_agent

ALL = ["start", "model", "events", "result", "execution kept", "cancel"]


def check(capsys, url: str, gym_url: str) -> tuple[int, dict[str, str], str]:
    rc = cua_agent(["check", url, "--gym", gym_url, "--gym-id", "desktop"])
    lines = capsys.readouterr().out.splitlines()
    found = {line.split(": ", 2)[1]: line.split(": ", 2)[2] for line in lines if line.startswith("check: ")}
    return rc, found, lines[-1]


def test_our_agent_passes_every_check(capsys, agent, gym):
    rc, found, last = check(capsys, agent.url, gym.url)
    assert rc == 0, (found, last)
    assert list(found) == ALL and all(v.startswith("ok") for v in found.values()), found
    assert found["result"].startswith("ok (completed, answer 'cua-check-answer'"), found
    assert last == f"the agent service at {agent.url} passes all 6 checks"
    assert not gym.manager.executions, "the check left an execution running"


def test_a_file_server_fails_and_a_missing_token_is_named(capsys, gym, file_server, monkeypatch):
    rc, found, last = check(capsys, file_server, gym.url)
    assert rc == 1
    assert found["start"] == "FAILED: HTTP 501: an HTML page: not an agent service", found
    assert found["model"] == "not run: no run started"
    assert last == f"the agent service at {file_server} fails 2 of 6 checks: start, cancel", last
    with start_agent_server(token="agent-secret") as guarded:
        rc, found, last = check(capsys, guarded.url, gym.url)
    assert rc == 1 and found["start"].startswith("FAILED: HTTP 401: needs a token (CUA_AGENT_TOKEN)"), found
    assert not gym.manager.executions


def test_an_agent_that_never_calls_the_model_fails_naming_the_checks(capsys, monkeypatch):
    """The agent double replays scripted events without calling any model (a half-broken agent), on the genv double
    as the gym: the checks that need the model fail by name, the protocol's shapes pass."""
    from cua_rl.http.serve import serve_app_in_thread
    from cua_rl.mini_agent import conformance
    from tests.doubles.agent_double import AgentState, build_agent_double
    from tests.doubles.genv_double import GymState, build_gym_double

    monkeypatch.setattr(conformance, "CANCEL_S", 1.0)
    gym_state = GymState(refuse_unknown=True)
    gym = serve_app_in_thread(build_gym_double(gym_state))
    fake = serve_app_in_thread(build_agent_double(AgentState()))
    try:
        rc = cua_agent(["check", fake.url, "--gym", gym.url, "--gym-id", "g1"])
    finally:
        fake.stop()
        gym.stop()
    lines = capsys.readouterr().out.splitlines()
    found = {line.split(": ", 2)[1]: line.split(": ", 2)[2] for line in lines if line.startswith("check: ")}
    assert rc == 1 and found["start"].startswith("ok (run run-1)"), found
    assert found["model"] == "FAILED: the agent never called the model at model.baseUrl", found
    assert found["events"].startswith("FAILED: no action_executed event whose gym result is ok"), found
    assert found["result"] == "FAILED: the run's answer is 'done', the model answered 'cua-check-answer'", found
    assert found["cancel"] == "FAILED: the run never called the model within 1 s; nothing to cancel", found
    assert lines[-1].endswith("fails 4 of 6 checks: model, events, result, cancel"), lines[-1]
    assert sorted(gym_state.terminated) == ["exec-1", "exec-2"]   # the check ends what it created
