"""The agent service's HTTP surface without desktops: payload validation, 404s, event windows, retention,
the command line. Runs here point at a closed port for the gym, which is a real failure mode."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent_helpers import fast_settings, wait_finished
from cua_rl.http.serve import free_port
from cua_rl.local_agent import start_agent_server
from cua_rl.local_agent.record import RunRecord, iso, parse_time
from cua_rl.local_agent.server import RunManager
from cua_rl.mini_agent import MiniAgentClient, RunRequest
from tests.hosts import stop, wait_http


def closed_port() -> int:
    return free_port()  # nobody listens on it once the probe socket is closed


def payload(**overrides):
    body = {"task": "open the editor", "agent": "qwen3-vl", "maxSteps": 3,
            "model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m", "apiKey": "sk-secret"},
            "env": {"type": "genv", "gymBaseUrl": f"http://127.0.0.1:{closed_port()}", "gymId": "desktop",
                    "executionId": "e1"},
            "standardActionSpace": "pc"}
    body.update(overrides)
    return body


def to_request(body: dict) -> RunRequest:
    """``body`` (a ``payload()``) as the mini-agent client's request."""
    return RunRequest.model_validate(body)


@pytest.mark.parametrize("change,field", [
    ({"agent": "gpt-agent"}, "unknown agent"),
    ({"standardActionSpace": "tablet"}, "standardActionSpace"),
    ({"task": "   "}, "blank"),
    ({"maxSteps": 0}, "maxSteps"),
    ({"env": {"type": "genv", "gymId": "d", "executionId": "e"}}, "gymBaseUrl"),
    ({"model": {"baseUrl": "ftp://x"}}, "http(s) URL"),
    ({"sampling": {"temperature": -1}}, "temperature"),
    # upper bounds (issue 66): a run of 1e308 s never ends and holds its desktop
    ({"maxRunTimeSec": 1e308}, "maxRunTimeSec"),
    ({"maxStepTimeSec": 1e308}, "maxStepTimeSec"),
    ({"maxInvalidTurns": 10**9}, "maxInvalidTurns"),
    ({"sampling": {"max_tokens": 10**12}}, "max_tokens"),
    ({"sampling": {"temperature": 1e308}}, "temperature"),
])
async def test_bad_payloads_are_rejected_with_the_field_named(agent, change, field):
    async with httpx.AsyncClient(base_url=agent.url) as http:
        response = await http.post("/runs", json=payload(**change))
        assert response.status_code == 422
        assert field in response.text
        assert (await http.get("/runs")).json()["runs"] == []  # nothing started


async def test_unknown_runs_are_404(agent):
    async with httpx.AsyncClient(base_url=agent.url) as http:
        for method, path in (("GET", "/runs/nope"), ("GET", "/runs/nope/events"), ("GET", "/runs/nope/steps"),
                             ("GET", "/runs/nope/steps/0"), ("GET", "/runs/nope/tokens"),
                             ("GET", "/runs/nope/trajectory"), ("POST", "/runs/nope/cancel")):
            response = await http.request(method, path, json={} if method == "POST" else None)
            assert response.status_code == 404, path
            assert "not found" in response.json()["detail"]


async def test_unreachable_gym_fails_the_run_with_a_reason_and_events_can_be_windowed(agent):
    async with httpx.AsyncClient(base_url=agent.url) as http:
        run_id = (await http.post("/runs", json=payload())).json()["runId"]
        status = await wait_finished(http, run_id)
        assert status["status"] == "failed" and status["ok"] is False
        assert "gym get execution failed" in status["reason"] and "cannot reach gym" in status["reason"]
        assert "sk-secret" not in str(status)  # the api key is never echoed
        events = (await http.get(f"/runs/{run_id}/events")).json()["events"]
        assert [e["type"] for e in events] == ["error", "run_end"]
        end = events[-1]
        assert end["ok"] is False and end["reason"] == status["reason"]
        assert end["failure"] == "env"     # the gym's failure, not the policy's: a trainer drops such a run
        # from is inclusive, to exclusive; epoch milliseconds work too
        assert (await http.get(f"/runs/{run_id}/events", params={"from": end["ts"]})).json()["events"][-1] == end
        assert (await http.get(f"/runs/{run_id}/events", params={"to": events[0]["ts"]})).json()["events"] == []
        ms = int(parse_time(end["ts"]).timestamp() * 1000)
        assert (await http.get(f"/runs/{run_id}/events", params={"from": str(ms)})).json()["events"][-1] == end
        bad = await http.get(f"/runs/{run_id}/events", params={"from": "yesterday"})
        assert bad.status_code == 400 and "ISO-8601" in bad.json()["detail"]
        assert (await http.get(f"/runs/{run_id}/steps/0")).status_code == 404
        assert (await http.get(f"/runs/{run_id}/screenshots/1")).status_code == 404
        # cancelling a finished run changes nothing
        cancelled = (await http.post(f"/runs/{run_id}/cancel", json={})).json()
        assert cancelled["status"] == "failed"


def test_event_windows_and_timestamps():
    record = RunRecord(run_id="r", request={}, agent="qwen3-vl")
    for i in range(5):
        record.emit("step_start", i + 1)
    times = [parse_time(e["ts"]) for e in record.events]
    assert times == sorted(times)  # never goes backwards
    assert all(e["ts"].endswith("Z") for e in record.events)
    assert record.events_between(times[2], None) == [e for e in record.events if parse_time(e["ts"]) >= times[2]]
    assert record.events_between(None, times[0]) == []
    assert parse_time("2026-01-01T00:00:00") == parse_time("2026-01-01T00:00:00.000Z")
    assert iso(parse_time("1767225600000")) == "2026-01-01T00:00:00.000Z"
    record.finish(True, "done")
    record.finish(False, "again")  # only the first end counts
    assert record.status == "completed" and [e["type"] for e in record.events].count("run_end") == 1


def test_finished_runs_are_pruned_oldest_first():
    manager = RunManager(fast_settings(keep_finished_runs=2, finished_ttl_s=100))
    for i in range(4):
        record = RunRecord(run_id=f"r{i}", request={}, agent="qwen3-vl")
        record.finish(True, "done")
        record.ended_monotonic = time.monotonic() - 10 + i
        manager.runs[record.run_id] = record
    running = RunRecord(run_id="live", request={}, agent="qwen3-vl")
    manager.runs["live"] = running
    manager._prune()
    assert sorted(manager.runs) == ["live", "r2", "r3"]
    manager.runs["r3"].ended_monotonic = time.monotonic() - 1000
    manager._prune()
    assert sorted(manager.runs) == ["live", "r2"]


async def test_concurrency_cap_answers_503():
    with start_agent_server(settings=fast_settings(max_concurrent_runs=1)) as agent:
        slow_gym = payload()
        async with httpx.AsyncClient(base_url=agent.url) as http:
            # a gym that accepts the connection but never answers keeps the first run busy
            with socket.socket() as listener:
                listener.bind(("127.0.0.1", 0))
                listener.listen(8)
                slow_gym["env"]["gymBaseUrl"] = f"http://127.0.0.1:{listener.getsockname()[1]}"
                first = await http.post("/runs", json=slow_gym)
                assert first.status_code == 200
                second = await http.post("/runs", json=slow_gym)
                assert second.status_code == 503 and "allows 1 at once" in second.json()["detail"]
                await http.post(f"/runs/{first.json()['runId']}/cancel", json={})
                status = (await http.get(f"/runs/{first.json()['runId']}")).json()
                assert status["status"] == "cancelled"


def test_cli_serves_and_validates_flags(tmp_path):
    env = dict(os.environ)
    bad = subprocess.run([sys.executable, "-m", "cua_rl.local_agent", "serve", "--history-images", "0"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "--history-images must be >= 1" in bad.stderr
    port, log = closed_port(), tmp_path / "agent.log"
    proc = _serve_agent(["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"], env, log)
    try:
        health = wait_http(f"http://127.0.0.1:{port}/health", proc, log).json()
        assert health["ok"] is True and {"qwen3-vl", "mai-ui"} <= set(health["agents"])
    finally:
        stop(proc, group=False)


async def test_stop_cancels_running_runs_and_returns_promptly():
    agent = start_agent_server(settings=fast_settings())
    with socket.socket() as listener:  # a gym that accepts connections and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        body = payload()
        body["env"]["gymBaseUrl"] = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=agent.url) as http:
            run_id = (await http.post("/runs", json=body)).json()["runId"]
        manager = agent.server.config.app.state.manager
        record = manager.runs[run_id]
        t0 = time.monotonic()
        await asyncio.to_thread(agent.stop)
        assert time.monotonic() - t0 < 15 and not agent.thread.is_alive()
    assert record.status == "cancelled" and record.reason == "agent service shutting down"
    assert record.events[-1]["type"] == "run_end"


def _serve_agent(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``cua-agent serve ARGS``, its log (stderr) into ``log``."""
    with open(log, "w") as sink:
        return subprocess.Popen([sys.executable, "-m", "cua_rl.local_agent", "serve", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=sink)


async def test_an_agent_service_with_a_token_serves_only_its_holders(tmp_path, monkeypatch):
    """Issue 80: an agent service on a network address answered anyone: a stranger could start runs on anyone's
    executions, read every run (screenshots, replies, the task) and cancel it. With ``CUA_AGENT_TOKEN`` every route
    but ``/health`` answers 401 without the token; the mini-agent client sends it (here from the file
    ``CUA_AGENT_TOKEN_FILE`` names), and no log line holds it."""
    token = "agent-" + os.urandom(16).hex()
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUA_AGENT_TOKEN")}
    log = tmp_path / "agent.log"
    proc = _serve_agent(["--host", "0.0.0.0", "--port", str(port), "--log-level", "debug"],
                        {**env, "CUA_AGENT_TOKEN": token}, log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", proc, log)
        async with httpx.AsyncClient(base_url=base, timeout=30) as stranger:
            for headers in ({}, {"Authorization": "Bearer " + token[:-1]}):
                started = await stranger.post("/runs", json=payload(), headers=headers)
                assert started.status_code == 401, started.text
            assert (await stranger.get("/runs")).status_code == 401
            (tmp_path / "token").write_text(token + "\n")
            monkeypatch.delenv("CUA_AGENT_TOKEN", raising=False)
            monkeypatch.setenv("CUA_AGENT_TOKEN_FILE", str(tmp_path / "token"))
            async with MiniAgentClient(base) as owner:
                run_id = await owner.start_run(to_request(payload()))
                for method, path in (("GET", f"/runs/{run_id}"), ("GET", f"/runs/{run_id}/events"),
                                     ("GET", f"/runs/{run_id}/steps"), ("GET", f"/runs/{run_id}/trajectory"),
                                     ("POST", f"/runs/{run_id}/cancel")):
                    answer = await stranger.request(method, path, json={} if method == "POST" else None)
                    assert answer.status_code == 401, (path, answer.text)
                assert (await owner.status(run_id)).status in ("running", "failed")
    finally:
        stop(proc, group=False)
    assert token not in log.read_text()


def test_an_agent_service_on_a_network_address_needs_a_token(tmp_path):
    """Issue 80: without a token ``cua-agent serve`` on an address other than loopback is refused at start with
    what to do; with ``--token-file`` it serves, and only to the token's holders."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUA_AGENT_TOKEN")}
    refused = subprocess.run([sys.executable, "-m", "cua_rl.local_agent", "serve", "--host", "0.0.0.0", "--port",
                              str(closed_port())], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "refusing to serve on 0.0.0.0 without a token" in refused.stderr and "CUA_AGENT_TOKEN" in refused.stderr
    (tmp_path / "token").write_text("from-a-file\n")
    port = closed_port()
    log = tmp_path / "agent.log"
    proc = _serve_agent(["--host", "0.0.0.0", "--port", str(port), "--token-file", str(tmp_path / "token")], env,
                        log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, log)
        assert httpx.get(f"http://127.0.0.1:{port}/runs").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/runs", headers={"Authorization": "Bearer from-a-file"}).json() \
            == {"runs": []}
    finally:
        stop(proc, group=False)


async def test_a_continuation_must_show_its_parents_model_key(agent):
    """Issue 80: a stranger continued another agent run with ``startFrom`` and its model received that run's
    screenshots, replies and task. A continuation must show the model key its parent was started with
    (``startFrom.apiKey``, else its own ``model.apiKey``): else 403 saying why, before anything else is looked at;
    a run started without a key cannot be continued. (The continuation itself: tests/local_agent/
    test_agent_desktop.py::test_a_continuation_starts_from_its_parents_history.)"""
    async with httpx.AsyncClient(base_url=agent.url) as http:
        parent = (await http.post("/runs", json=payload())).json()["runId"]          # model key sk-secret
        keyless = (await http.post("/runs", json={**payload(), "model": {"baseUrl": "http://127.0.0.1:9/v1"}})).json()
        await wait_finished(http, parent)
        await wait_finished(http, keyless["runId"])
        before = (await http.get("/runs")).json()

        def continuation(key: str | None, run_id: str = parent, shown: str | None = None) -> dict:
            body = payload(startFrom={"runId": run_id, "steps": 1, **({"apiKey": shown} if shown else {})})
            body["model"] = {"baseUrl": "http://127.0.0.1:9/v1", **({"apiKey": key} if key else {})}
            return body

        for body in (continuation("sk-stranger"), continuation(None), continuation("sk-stranger", shown="sk-guess")):
            refused = await http.post("/runs", json=body)
            assert refused.status_code == 403, refused.text
            assert "another model key" in refused.json()["detail"] and "sk-" not in refused.text
        refused = await http.post("/runs", json=continuation(None, keyless["runId"]))
        assert refused.status_code == 403 and "started without model.apiKey" in refused.json()["detail"]
        # the parent's key, as its own or shown in startFrom, passes: this parent has no step to continue from
        for body in (continuation("sk-secret"), continuation("sk-child", shown="sk-secret")):
            answer = await http.post("/runs", json=body)
            assert answer.status_code == 422 and "startFrom.steps" in answer.json()["detail"], answer.text
        assert (await http.get("/runs")).json() == before   # nothing started
        shown = (await http.get(f"/runs/{parent}")).json()
        assert "sk-secret" not in str(shown)
