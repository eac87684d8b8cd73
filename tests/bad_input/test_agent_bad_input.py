"""The agent service refuses every request of its malformed-request corpus (start-run payloads, event
windows, unknown runs and path tricks) with a clear 4xx, starts no run for any of them and stays healthy
(issue 16). The one run the corpus needs (for its event windows) points at a closed gym port and fails fast."""

from __future__ import annotations

import asyncio
import copy

import httpx
import pytest

from bad_input_corpus import Case, check_refused, json_bytes, nested, send
from cua_rl.http.retry import RetryPolicy
from cua_rl.http.serve import free_port
from cua_rl.local_agent import AgentSettings, start_agent_server
from tests.local_agent.agent_helpers import wait_finished

JSON = {"Content-Type": "application/json"}
GOOD = {"task": "open the editor", "agent": "qwen3-vl", "maxSteps": 3,
        "model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m", "apiKey": "sk-secret"},
        "env": {"type": "genv", "gymBaseUrl": "http://127.0.0.1:9", "gymId": "desktop", "executionId": "e1"}}


def payload(**changes) -> dict:
    """``GOOD`` with dotted keys replaced (``model.baseUrl``) or, given the value ``...``, removed."""
    body = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = body
        for p in parents:
            target = target[p]
        if value is ...:
            del target[leaf]
        else:
            target[leaf] = value
    return body


def start(name, says="", status=422, **changes):
    return Case(name, "POST", "/runs", json=payload(**changes), status=status, says=says)


EV = "/runs/{run_id}/events"
CASES = [
    # start-run: the body as a whole
    Case("non-JSON body", "POST", "/runs", content=b"task=open", headers=JSON, status=422, says="JSON"),
    Case("empty body", "POST", "/runs", content=b"", headers=JSON, status=422, says="body"),
    Case("array body", "POST", "/runs", json=[GOOD], status=422, says="dictionary"),
    # what a web page can send cross-origin without a CORS preflight (issue 80): refused as not JSON
    Case("text/plain JSON", "POST", "/runs", content=json_bytes(GOOD), headers={"Content-Type": "text/plain"},
         status=415, says="application/json"),
    Case("form body", "POST", "/runs", content=b"task=x&agent=mai-ui",
         headers={"Content-Type": "application/x-www-form-urlencoded"}, status=415),
    Case("cancel without a body or type", "POST", "/runs/{run_id}/cancel", status=415),
    Case("deep JSON", "POST", "/runs", content=nested(100_000), headers=JSON),
    Case("deep JSON in sampling", "POST", "/runs",
         content=json_bytes(payload())[:-1] + b', "sampling": {"stop": ' + nested(500) + b"}}", headers=JSON,
         says="deep"),
    Case("huge body", "POST", "/runs", json=payload(task="x" * 2_000_000), status=413, says="limit"),
    Case("bad UTF-8", "POST", "/runs", content=b'{"task": "\xff\xfe"}', headers=JSON, status=400, says="parsing the body"),
    # start-run: fields
    start("missing task", "task", task=...),
    start("missing model", "model", model=...),
    start("missing env", "env", env=...),
    start("task not a string", "task", task=123),
    start("blank task", "blank", task=" \n "),
    start("unknown agent", "unknown agent", agent="gpt-agent"),
    start("maxSteps text", "maxSteps", maxSteps="many"),
    start("maxSteps negative", "maxSteps", maxSteps=-1),
    start("maxSteps overflow", "maxSteps", maxSteps=10**30),
    start("maxSteps float", "maxSteps", maxSteps=2.5),
    start("maxRunTimeSec zero", "maxRunTimeSec", maxRunTimeSec=0),
    Case("maxRunTimeSec NaN", "POST", "/runs", content=json_bytes(payload())[:-1] + b', "maxRunTimeSec": NaN}',
         headers=JSON, status=422, says="maxRunTimeSec"),
    start("historyImages 0", "historyImages", historyImages=0),
    start("historyImages 99", "historyImages", historyImages=99),
    start("action space tablet", "standardActionSpace", standardActionSpace="tablet"),
    start("model not object", "model", model="http://127.0.0.1:9/v1"),
    start("baseUrl ftp", "http(s) URL", model__baseUrl="ftp://host/v1"),
    start("baseUrl no host", "host", model__baseUrl="http://"),
    start("apiKey number", "apiKey", model__apiKey=12345),
    start("env type docker", "type", env__type="docker"),
    start("gymBaseUrl file", "http(s) URL", env__gymBaseUrl="file:///etc/passwd"),
    start("gymBaseUrl no host", "host", env__gymBaseUrl="https:///api"),
    start("executionId empty", "executionId", env__executionId=""),
    start("executionId ..", "executionId", env__executionId=".."),
    start("executionId with slash", "executionId", env__executionId="../../tasks/001"),
    start("gymId with query", "gymId", env__gymId="desktop?x=1"),
    start("sampling temperature", "temperature", sampling={"temperature": -1}),
    start("sampling top_p", "top_p", sampling={"top_p": 2}),
    start("sampling max_tokens", "max_tokens", sampling={"max_tokens": 0}),
    start("sampling list", "sampling", sampling=[0.5]),
    # events and other reads
    Case("events unknown run", "GET", "/runs/nope/events", status=404, says="not found"),
    Case("events run ..%2F", "GET", "/runs/..%2F{run_id}/events", status=404),
    Case("events from garbage", "GET", EV + "?from=yesterday", status=400, says="from"),
    Case("events to garbage", "GET", EV + "?to=2024-13-45T99:00", status=400, says="to"),
    Case("events from year overflow", "GET", EV + "?from=99999999999999999999", status=400, says="from"),
    Case("events from infinite", "GET", EV + "?from=1" + "0" * 400, status=400, says="from"),
    Case("events to NaN", "GET", EV + "?to=nan", status=400, says="to"),
    Case("step index text", "GET", "/runs/{run_id}/steps/first", status=422),
    Case("step index negative", "GET", "/runs/{run_id}/steps/-1", status=404),
    Case("step index overflow", "GET", "/runs/{run_id}/steps/" + "9" * 40, status=404),
    Case("screenshot traversal", "GET", "/runs/{run_id}/screenshots/..%2F..%2F..%2Fetc%2Fpasswd", status=404),
    Case("cancel unknown", "POST", "/runs/nope/cancel", json={}, status=404),
    Case("wrong method", "DELETE", "/runs", headers=JSON, status=405),
]


@pytest.fixture(scope="module")
def agent():
    """The real agent service with one finished run (its gym port is closed, so it fails at once)."""
    fast = RetryPolicy(attempts=1, backoff_s=0.01)
    with start_agent_server(settings=AgentSettings(model_retry=fast, gym_retry=fast)) as served:
        body = payload(env__gymBaseUrl=f"http://127.0.0.1:{free_port()}")
        run_id = httpx.post(f"{served.url}/runs", json=body, timeout=30).json()["runId"]
        asyncio.run(_wait_finished(served.url, run_id))
        yield served, run_id


async def _wait_finished(url: str, run_id: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        await wait_finished(http, run_id)


async def runs(url: str) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/runs")).json()["runs"]


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_agent_service_refuses(agent, case):
    served, run_id = agent
    before = await runs(served.url)
    out = await send("agent service", served.url, case, {"run_id": run_id})
    check_refused(case, out)
    assert "sk-secret" not in out.text
    assert await runs(served.url) == before, f"{case.name} started or changed a run"


async def test_agent_service_is_healthy_after_the_corpus(agent):
    served, run_id = agent
    assert len(CASES) >= 30
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as http:
        health = (await http.get("/health")).json()
        assert health["ok"] is True and health["running"] == 0 and health["runs"] == 1
        events = await http.get(f"/runs/{run_id}/events", params={"from": "0"})
        assert events.status_code == 200 and events.json()["events"][-1]["type"] == "run_end"
        started = await http.post("/runs", json=GOOD)
        assert started.status_code == 200 and started.json()["runId"] != run_id


async def test_a_chunked_body_without_length_is_capped_while_read(agent):
    """No Content-Length to refuse up front: ``BodyLimit`` counts the chunks and stops at the cap."""
    served, _ = agent
    before = await runs(served.url)

    async def chunks():
        for _ in range(40):  # 2.5 MiB in 64 KiB pieces
            yield b" " * 65536

    async with httpx.AsyncClient(base_url=served.url, timeout=15) as http:
        r = await http.post("/runs", content=chunks(), headers=JSON)
    assert r.status_code == 413 and "limit of 1048576 bytes" in r.json()["detail"]
    assert await runs(served.url) == before
