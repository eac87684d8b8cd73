"""``--dry-run`` probes the external services a run would use (cua_rl/run/probes.py, issue 84): each gym host, the
agent service and the monitor answer one cheap question before AReaL loads and vLLM starts, each in a line
``probe: <role> <url>: ok`` or what went wrong; any failure exits 1; ``--offline`` skips them. Real servers on
loopback: our gym (no desktop is started to list tasks) and our agent service, a plain file server, a port
nobody listens on, a socket that accepts and never answers."""

from __future__ import annotations

import socket
import time

import pytest

from cua_rl.http.serve import free_port
from cua_rl.local_agent import start_agent_server
from cua_rl.local_gym import start_gym_server


@pytest.fixture(scope="module")
def live():
    """Our gym and our agent service on loopback, each with its own token."""
    with start_gym_server(port=0, pool_size=0, x_spares=0, token="gym-secret") as gym, \
            start_agent_server(token="agent-secret") as agent:
        yield gym, agent


def probe_lines(out) -> list[str]:
    return [line for line in out.out.splitlines() if line.startswith("probe")]


def test_a_dry_run_against_an_unreachable_gym_with_a_live_agent_fails_naming_the_gym(launcher, live, monkeypatch):
    _gym, agent = live
    monkeypatch.setenv("CUA_AGENT_TOKEN", "agent-secret")
    dead = f"http://127.0.0.1:{free_port()}"
    rc, _, _, out = launcher(["--gym", dead, "--gym-id", "desktop", "--gbox-mini-url", agent.url], offline=False)
    assert rc == 1, out.out + out.err
    assert probe_lines(out) == [f"probe: gym {dead}: connection refused (nothing listens on that port)",
                                f"probe: agent {agent.url}: ok",
                                "probes: 1 of 2 failed; fix them, or pass --offline to skip the probes"]


def test_a_dry_run_against_both_live_passes_and_a_missing_token_is_named(launcher, live, monkeypatch):
    gym, agent = live
    monkeypatch.setenv("CUA_GYM_TOKEN", "gym-secret")
    monkeypatch.setenv("CUA_AGENT_TOKEN", "agent-secret")
    args = ["--gym", gym.url, "--gym-id", "desktop", "--gbox-mini-url", agent.url]
    rc, _, _, out = launcher(args, offline=False)
    assert rc == 0, out.out + out.err
    assert probe_lines(out) == [f"probe: gym {gym.url}: ok", f"probe: agent {agent.url}: ok"]
    assert "gym-secret" not in out.out + out.err and "agent-secret" not in out.out + out.err
    monkeypatch.delenv("CUA_GYM_TOKEN")
    monkeypatch.setenv("CUA_AGENT_TOKEN", "wrong")
    rc, _, _, out = launcher(args, offline=False)
    assert rc == 1, out.out
    assert probe_lines(out)[:2] == [f"probe: gym {gym.url}: 401: needs a token (CUA_GYM_TOKEN or CUA_GYM_TOKEN_FILE)",
                                    f"probe: agent {agent.url}: 401: the token was refused (CUA_AGENT_TOKEN)"]
    # a gym id the gym does not serve
    monkeypatch.setenv("CUA_GYM_TOKEN", "gym-secret")
    monkeypatch.setenv("CUA_AGENT_TOKEN", "agent-secret")
    rc, _, _, out = launcher(["--gym", gym.url, "--gym-id", "android", "--gbox-mini-url", agent.url], offline=False)
    assert rc == 1 and "probe: gym " + gym.url + ": HTTP 404 on GET /api/v1/android/tasks" in out.out, out.out


def test_a_file_server_is_not_our_protocol_and_offline_skips_every_probe(launcher, file_server):
    """A fleet of two hosts (one a file server, one nobody) and a file server as agent and monitor: a line each."""
    dead = f"http://127.0.0.1:{free_port()}"
    args = ["--gym", f"{file_server},{dead}", "--gym-id", "desktop", "--gbox-mini-url", file_server,
            "--monitor-base-url", file_server]
    rc, _, _, out = launcher(args, offline=False)
    assert rc == 1
    lines = probe_lines(out)
    assert lines[0].startswith(f"probe: gym {file_server}: HTTP 404 on GET /api/v1/desktop/tasks") or \
        lines[0].startswith(f"probe: gym {file_server}: not our protocol"), lines[0]
    assert lines[1] == f"probe: gym {dead}: connection refused (nothing listens on that port)"
    assert lines[2].startswith(f"probe: agent {file_server}: not our protocol"), lines[2]
    assert lines[3].startswith(f"probe: monitor {file_server}: HTTP 404 on GET /healthz"), lines[3]
    assert lines[4] == "probes: 4 of 4 failed; fix them, or pass --offline to skip the probes"
    rc, _, _, out = launcher(args)   # the fixture's default: --offline
    assert rc == 0 and probe_lines(out) == [], out.out


def test_a_silent_server_times_out_within_the_bound_and_embedded_stacks_probe_nothing(launcher, monkeypatch):
    from cua_rl.run import probes

    monkeypatch.setattr(probes, "TIMEOUT_S", 1.0)
    with socket.socket() as silent:   # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        rc, _, _, out = launcher(["--gym", url, "--gym-id", "desktop", "--agent", "embedded"], offline=False)
        took = time.monotonic() - started
    assert rc == 1 and probe_lines(out)[0] == f"probe: gym {url}: timed out: connected, no answer within 1 s"
    assert took < 10, took
    rc, _, _, out = launcher([], offline=False)   # the embedded stack: started by the run, nothing to probe
    assert rc == 0 and probe_lines(out) == [], out.out


def test_a_stock_agent_and_our_monitor_pass(launcher, live, tmp_path, monkeypatch):
    """The agent double (a gbox-mini-agent stand-in: FastAPI, its own 404 for an unknown run) and our Training
    Monitor (with a read token: its /healthz is open) answer their probes; the gym is ours, reached with its token.
    Each probe asks its own service (before: the agent's probe asked the monitor's URL, a closure bound late)."""
    from cua_rl.http.serve import serve_app_in_thread
    from cua_rl.monitor.embedded import start_monitor
    from tests.doubles.agent_double import AgentState, build_agent_double

    gym, _agent = live
    monkeypatch.setenv("CUA_GYM_TOKEN", "gym-secret")
    stock = serve_app_in_thread(build_agent_double(AgentState()))
    monitor = start_monitor(tmp_path / "monitor", read_token="reads")
    try:
        rc, _, _, out = launcher(["--gym", gym.url, "--gym-id", "desktop", "--gbox-mini-url", stock.url,
                                  "--monitor-base-url", monitor.url], offline=False)
    finally:
        monitor.stop()
        stock.stop()
    assert rc == 0, out.out + out.err
    assert probe_lines(out) == [f"probe: gym {gym.url}: ok", f"probe: agent {stock.url}: ok",
                                f"probe: monitor {monitor.url}: ok"]


def test_offline_goes_with_the_dry_run_only():
    from cua_rl.run import cli

    assert cli.parse(["--dry-run", "--offline"], {}, []).offline
    with pytest.raises(cli.UsageError, match="--offline goes with --dry-run"):
        cli.parse(["--offline", "--gym", "http://127.0.0.1:9"], {}, [])
