"""``cua-agent check URL --gym URL --gym-id ID`` (cua_rl/mini_agent/conformance.py, issue 84): an agent author's
conformance probe of docs/protocols.md §2.8, a short run and a cancelled one against a scripted model the check
serves itself. Real servers on loopback: our agent service and our gym (real desktops) pass; a plain file server
as the agent fails naming the checks; a missing agent token is named."""

from __future__ import annotations

from cua_rl.local_agent.__main__ import main as cua_agent
from cua_rl.local_agent import start_agent_server

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
