"""The embedded gym refuses every request of its malformed-request corpus with a clear 4xx, creates no
execution or desktop for any of them, leaves the running execution usable and stays healthy (issue 16); the
corpus holds what a web page can send cross-origin without a preflight, which state changes refuse (issue 80)."""

from __future__ import annotations

import httpx
import pytest

from bad_input_corpus import Case, check_refused, json_bytes, nested, send

pytestmark = pytest.mark.desktop
G = "/api/v1/desktop"
E = G + "/executions/{eid}"
JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain;charset=UTF-8"}   # what fetch() sends with a string body
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def act(name, action, says="", status=None):
    return Case(name, "POST", E + "/actions", json={"action": action}, says=says, status=status)


CASES = [
    # unknown ids and path tricks
    Case("unknown gym", "GET", "/api/v1/nogym/tasks", status=404, says="unknown gym"),
    Case("unknown task", "GET", G + "/tasks/999", status=404, says="unknown task"),
    Case("create unknown task", "POST", G + "/tasks/no-such-task", json={}, status=404, says="unknown task"),
    Case("create task ..%2F", "POST", G + "/tasks/..%2F..%2Fetc%2Fpasswd", json={}, status=404),
    Case("create task %2E%2E", "POST", G + "/tasks/%2E%2E", json={}, status=404),
    Case("unknown execution", "GET", G + "/executions/nope", status=404, says="unknown execution"),
    Case("execution ..%2F", "GET", G + "/executions/..%2F{eid}", status=404),
    Case("screenshot of unknown", "GET", G + "/executions/nope/screenshot", status=404),
    Case("act on unknown", "POST", G + "/executions/nope/actions", json={"action": {"type": "wait", "ms": 1}},
         status=404),
    Case("evaluate unknown", "POST", G + "/executions/nope/evaluate", json={}, status=404),
    Case("terminate unknown", "POST", G + "/executions/nope/terminate", json={}, status=404),
    Case("terminate %2F id", "POST", G + "/executions/{eid}%2F..%2Fnope/terminate", json={}, status=404),
    Case("wrong method", "DELETE", G + "/tasks/001", headers=JSON, status=405),
    # create-execution bodies
    Case("create non-JSON", "POST", G + "/tasks/001", content=b"seed=7", headers=JSON, says="not valid JSON"),
    Case("create array body", "POST", G + "/tasks/001", json=[1, 2], says="JSON object"),
    Case("create null body", "POST", G + "/tasks/001", content=b"null", headers=JSON, status=422, says="not null"),
    Case("create options string", "POST", G + "/tasks/001", json={"options": "seed=7"}, says="options"),
    Case("create seed string", "POST", G + "/tasks/001", json={"options": {"seed": "7"}}, says="seed"),
    Case("create seed negative", "POST", G + "/tasks/001", json={"options": {"seed": -1}}, says="seed"),
    Case("create seed overflow", "POST", G + "/tasks/001", json={"options": {"seed": 2**80}}, says="seed"),
    Case("create seed float", "POST", G + "/tasks/001", json={"options": {"seed": 1.5}}, says="seed"),
    Case("create seed NaN", "POST", G + "/tasks/001", content=b'{"options": {"seed": NaN}}', headers=JSON,
         says="seed"),
    Case("create deep JSON", "POST", G + "/tasks/001", content=nested(100_000), headers=JSON, says="deep"),
    Case("create huge body", "POST", G + "/tasks/001", content=b" " * (2 * 1024 * 1024) + b"{}", headers=JSON,
         status=413, says="limit"),
    Case("create bad UTF-8", "POST", G + "/tasks/001", content=b'{"options": "\xff\xfe"}', headers=JSON,
         says="JSON"),
    # screenshots
    Case("screenshot gif", "GET", E + "/screenshot?format=gif", status=422, says="format"),
    Case("screenshot quality 0", "GET", E + "/screenshot?quality=0", status=422, says="quality"),
    Case("screenshot quality text", "GET", E + "/screenshot?quality=high", status=422, says="quality"),
    Case("screenshot quality overflow", "GET", E + "/screenshot?quality=" + "9" * 40, status=422),
    # actions
    Case("act non-JSON", "POST", E + "/actions", content=b"click 0.5 0.5", headers=JSON, says="not valid JSON"),
    Case("act empty body", "POST", E + "/actions", content=b"", headers=JSON, says="action"),
    Case("act array body", "POST", E + "/actions", json=[{"type": "wait"}], says="action"),
    Case("act deep JSON", "POST", E + "/actions", content=b'{"action": ' + nested(5000) + b"}", headers=JSON,
         says="deep"),
    Case("act huge body", "POST", E + "/actions", content=json_bytes({"action": {"type": "type",
                                                                                  "text": "x" * 2_000_000}}),
         headers=JSON, status=413),
    act("act missing type", {"x": 0.5, "y": 0.5}, "unknown action type"),
    act("act unknown type", {"type": "teleport"}, "unknown action type"),
    act("act x outside", {"type": "click", "x": 1.5, "y": 0.5}, "outside the screen"),
    act("act x negative", {"type": "click", "x": -0.1, "y": 0.5}, "outside the screen"),
    act("act x string", {"type": "click", "x": "0.5", "y": 0.5}, "must be a number"),
    act("act x missing", {"type": "move", "y": 0.5}, "missing x"),
    act("act bad button", {"type": "click", "x": 0.5, "y": 0.5, "button": "thumb"}, "button"),
    act("act count 10", {"type": "click", "x": 0.5, "y": 0.5, "count": 10}, "count"),
    act("act scroll overflow", {"type": "scroll", "x": 0.5, "y": 0.5, "dy": 10**30}, "dy"),
    act("act text not string", {"type": "type", "text": ["a"]}, "text"),
    act("act text too long", {"type": "type", "text": "x" * 5000}, "at most", status=413),
    act("act text control chars", {"type": "type", "text": "rm -rf\x1b[A"}, "control characters"),
    act("act unknown key", {"type": "key", "keys": ["ctrl", "hyperdrive"]}, "unknown key"),
    act("act seven keys", {"type": "key", "keys": ["a"] * 7}, "1-6 key names"),
    act("act wait negative", {"type": "wait", "ms": -5}, "ms"),
    act("act wait overflow", {"type": "wait", "ms": 1e300}, "ms"),
    Case("act NaN coordinate", "POST", E + "/actions", content=b'{"action": {"type": "move", "x": NaN, "y": 0.5}}',
         headers=JSON, says="number"),
    # fork bodies (docs/protocols.md §1.9): refused before any child is made
    Case("fork unknown", "POST", G + "/executions/nope/fork", json={"count": 1}, status=404, says="unknown execution"),
    Case("fork count 0", "POST", E + "/fork", json={"count": 0}, status=422, says="count"),
    Case("fork count text", "POST", E + "/fork", json={"count": "2"}, status=422, says="count"),
    Case("fork count huge", "POST", E + "/fork", json={"count": 10**9}, status=422, says="count"),
    Case("fork null body", "POST", E + "/fork", content=b"null", headers=JSON, status=422, says="JSON object"),
    Case("fork array body", "POST", E + "/fork", json=[2], status=422, says="JSON object"),
    Case("fork unknown field", "POST", E + "/fork", json={"count": 1, "depth": 3}, status=422, says="unknown fork"),
    # evaluate bodies
    Case("evaluate non-JSON", "POST", E + "/evaluate", content=b"answer=42", headers=JSON, says="not valid JSON"),
    Case("evaluate array body", "POST", E + "/evaluate", json=["answer"], says="object"),
    Case("evaluate deep JSON", "POST", E + "/evaluate", content=nested(100_000), headers=JSON, says="deep"),
    # what a web page open in a researcher's browser can send to a gym on loopback without a CORS preflight
    # (issue 80): a "simple" POST has no body, or a text/plain, form or multipart one; JSON-only refuses them all
    Case("create text/plain JSON", "POST", G + "/tasks/001", content=b"{}", headers=TEXT, status=415,
         says="application/json"),
    Case("create form content type", "POST", G + "/tasks/001", content=b"options=1", headers=FORM, status=415),
    Case("create multipart", "POST", G + "/tasks/001", content=b"--b--\r\n",
         headers={"Content-Type": "multipart/form-data; boundary=b"}, status=415),
    Case("create without a body or type", "POST", G + "/tasks/001", status=415),
    Case("act text/plain JSON", "POST", E + "/actions", content=json_bytes({"action": {"type": "wait", "ms": 1}}),
         headers=TEXT, status=415),
    Case("evaluate text/plain", "POST", E + "/evaluate", content=b"{}", headers=TEXT, status=415),
    Case("fork text/plain JSON", "POST", E + "/fork", content=b'{"count": 1}', headers=TEXT, status=415),
    Case("terminate without a body or type", "POST", E + "/terminate", status=415),
]


@pytest.fixture(scope="module")
def gym():
    """The real gym (Xvfb desktops, no spares) with one running execution of task 001."""
    from cua_rl.local_gym import start_gym_server
    from cua_rl.local_gym.procs import wait_until

    with start_gym_server(port=0, max_executions=3, pool_size=0, display_base=820) as server:
        created = httpx.post(f"{server.url}{G}/tasks/001", json={}, timeout=60)
        assert created.status_code == 200, created.text
        # the cold create took a bare X server: let the gym replace it before the snapshots compare pools
        x_spares = server.manager.opt.x_spares
        assert wait_until(lambda: server.manager.pool_stats()["bare_x"] == x_spares, 30.0)
        yield server, created.json()["execution_id"]


def snapshot(server) -> tuple:
    manager = server.manager
    return sorted(manager.executions), manager.pool_stats()


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_gym_refuses(gym, case):
    server, eid = gym
    before = snapshot(server)
    out = await send("gym", server.url, case, {"eid": eid})
    check_refused(case, out)
    assert snapshot(server) == before, f"{case.name} changed the gym's executions or desktops"


async def test_a_caller_that_hangs_up_mid_body_ends_quietly(gym, caplog):
    """An agent run cancelled while its action is sent (every run still in flight when training stops): the
    request ends without an 'Exception in ASGI application' traceback and changes nothing."""
    import asyncio
    from urllib.parse import urlsplit

    server, eid = gym
    before = snapshot(server)
    url = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"POST {G}/executions/{eid}/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: 500\r\n\r\n{{\"action\": ".encode())
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()  # hang up with most of the body unsent
    await asyncio.sleep(0.5)
    assert snapshot(server) == before
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


async def test_gym_is_healthy_after_the_corpus(gym):
    server, eid = gym
    assert len(CASES) >= 30
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        health = (await http.get("/health")).json()
        assert health["ok"] is True and health["executions"] == 1
        moved = await http.post(f"{G}/executions/{eid}/actions", json={"action": {"type": "move", "x": 0.5, "y": 0.5}})
        assert moved.status_code == 200 and moved.json()["ok"] is True
        shot = await http.get(f"{G}/executions/{eid}/screenshot")
        assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"
        assert (await http.post(f"{G}/executions/{eid}/terminate", json={})).status_code == 200
    assert server.manager.executions == {}
