"""Our Training Monitor refuses every request of its malformed-request corpus (ingest batches, screenshot
uploads, viewer reads) with a clear 4xx, writes no row and no screenshot for any of them, and stays healthy
(issue 16). The store is a SQLite file; tests/monitor runs the same server on PostgreSQL too."""

from __future__ import annotations

import hashlib
import io

import httpx
import pytest
from PIL import Image
from sqlalchemy import func, select

from bad_input_corpus import Case, check_refused, nested, send
from cua_rl.monitor.schema import TABLES

JSON = {"Content-Type": "application/json"}
INGEST = "/api/ingest/batch"
BIG = 2**70


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


PNG = png()
SHA = hashlib.sha256(PNG).hexdigest()


def batch(name, body, says="", status=422):
    return Case(name, "POST", INGEST, json=body, status=status, says=says)


def rollout(**fields) -> dict:
    return {"rollouts": [{"client_id": "r-bad", **fields}]}


CASES = [
    # ingest: auth and the body as a whole
    Case("no token", "POST", INGEST, json=rollout(), headers={"Authorization": None}, status=401, says="bearer"),
    Case("wrong token", "POST", INGEST, json=rollout(), headers={"Authorization": "Bearer nope"}, status=401),
    Case("basic auth", "POST", INGEST, json=rollout(), headers={"Authorization": "Basic {token}"}, status=401),
    Case("empty bearer", "POST", INGEST, json=rollout(), headers={"Authorization": "Bearer"}, status=401),
    Case("non-JSON", "POST", INGEST, content=b"rollouts=1", status=400, says="not valid JSON"),
    Case("empty body", "POST", INGEST, content=b"", status=400, says="not valid JSON"),
    Case("array body", "POST", INGEST, json=[rollout()], status=400, says="JSON object"),
    Case("bad UTF-8", "POST", INGEST, content=b'{"tasks": "\xff\xfe"}', headers=JSON, status=400, says="JSON"),
    Case("form body", "POST", INGEST, content=b"tasks=1", headers={"Content-Type": "application/x-www-form-urlencoded"},
         status=400, says="JSON"),
    Case("deep JSON", "POST", INGEST, content=nested(100_000), headers=JSON, status=400, says="deep"),
    Case("deep JSON in a field", "POST", INGEST, content=b'{"actions": [{"client_id": "a", "action_args": '
         + nested(100) + b"}]}", headers=JSON, status=400, says="deep"),
    Case("huge body", "POST", INGEST, content=b'{"tasks": [{"client_id": "' + b"x" * (9 * 1024 * 1024) + b'"}]}',
         headers=JSON, status=413, says="limit"),
    # ingest: structure and fields
    batch("unknown kind", {"widgets": []}, "unknown keys"),
    batch("empty batch", {}, "empty batch"),
    batch("kind not array", {"tasks": {"client_id": "t"}}, "expected an array"),
    batch("row not object", {"tasks": ["t1"]}, "expected an object"),
    batch("client_id missing", rollout(client_id=None), "client_id"),
    batch("client_id a number", {"tasks": [{"client_id": 7}]}, "client_id"),
    batch("client_id too long", {"tasks": [{"client_id": "c" * 300}]}, "client_id"),
    batch("int as text", rollout(num_turns="three"), "expected int"),
    batch("int as bool", rollout(num_turns=True), "expected int"),
    batch("int overflow", rollout(num_turns=BIG), "num_turns"),
    batch("negative overflow", rollout(batch=-BIG), "batch"),
    batch("link id overflow", rollout(training_id=BIG), "training_id"),
    Case("float NaN", "POST", INGEST, content=b'{"rollouts": [{"client_id": "r", "reward": NaN}]}', headers=JSON,
         status=422, says="expected float"),
    Case("float Infinity", "POST", INGEST, content=b'{"rollouts": [{"client_id": "r", "reward": 1e999}]}',
         headers=JSON, status=422, says="expected float"),
    batch("bool as text", rollout(task_success="true"), "expected bool"),
    batch("str as object", rollout(status={"s": 1}), "expected str"),
    batch("str too long", rollout(status="s" * 300), "limit", status=413),
    batch("unknown link id", rollout(training_id=999_999), "no training"),
    batch("unknown link client id", {"turns": [{"client_id": "t", "rollout_id": "ghost", "turn": 1}]}, "ghost"),
    batch("training id unknown", {"training": {"training_id": 999_999}}, "does not exist", status=404),
    batch("training id text", {"training": {"training_id": "one"}}, "training_id"),
    batch("training not object", {"training": "run0"}, "expected an object"),
    batch("5001 rows", {"tasks": [{"client_id": f"t{i}"} for i in range(5001)]}, "more than", status=413),
    # screenshot uploads
    Case("blob no token", "PUT", "/api/blobs/" + SHA, content=PNG, headers={"Authorization": None}, status=401),
    Case("blob bad name", "PUT", "/api/blobs/xyz", content=PNG, status=400, says="SHA-256"),
    Case("blob hash mismatch", "PUT", "/api/blobs/" + "0" * 64, content=PNG, status=400, says="does not match"),
    Case("blob not an image", "PUT", "/api/blobs/" + hashlib.sha256(b"GIF89a").hexdigest(), content=b"GIF89a",
         status=400, says="PNG"),
    Case("blob too large", "PUT", "/api/blobs/" + "a" * 64, content=PNG + b"\0" * (17 * 1024 * 1024), status=413,
         says="limit"),
    Case("blob path trick", "PUT", "/api/blobs/..%2F..%2Fmonitor.db", content=PNG),
    # reads
    Case("training id text", "GET", "/api/trainings/abc", status=422),
    Case("training id overflow", "GET", "/api/trainings/" + "9" * 30, status=422),
    Case("rollout id overflow", "GET", f"/api/rollouts/{BIG}", status=422),
    Case("steps id negative", "GET", "/api/steps/-1", status=422),
    Case("steps id unknown", "GET", "/api/steps/999999", status=404),
    Case("unknown kind", "GET", "/api/widgets/1", status=404),
    Case("blob traversal", "GET", "/blobs/..%2F..%2Fmonitor.db", status=404),
    Case("static traversal", "GET", "/static/..%2Fserver.py", status=404),
    Case("page id overflow", "GET", "/" + "9" * 30, status=422),
]


@pytest.fixture(scope="module")
def monitor(tmp_path_factory):
    from cua_rl.monitor.embedded import start_monitor

    with start_monitor(tmp_path_factory.mktemp("monitor")) as running:
        yield running, running.store.create_token("p1")


def written(running) -> tuple:
    with running.store.engine.connect() as conn:
        rows = {k: conn.execute(select(func.count()).select_from(t)).scalar() for k, t in TABLES.items()}
    return rows, sorted(p.name for p in running.blobs.root.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_monitor_refuses(monitor, case):
    running, token = monitor
    before = written(running)
    out = await send("monitor", running.url, case, {"token": token}, {"Authorization": "Bearer {token}"})
    check_refused(case, out)
    assert token not in out.text
    assert written(running) == before, f"{case.name} wrote a row or a screenshot"


async def test_monitor_is_healthy_after_the_corpus(monitor):
    running, token = monitor
    assert len(CASES) >= 30
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=running.url, timeout=30, headers=auth) as http:
        assert (await http.get("/healthz")).json() == {"ok": True}
        done = await http.post(INGEST, json={"training": {"run_name": "after", "status": "running"}})
        assert done.status_code == 200 and (await http.get(f"/api/trainings/{done.json()['training_id']}")).status_code == 200
        assert (await http.put(f"/api/blobs/{SHA}", content=PNG)).status_code == 201
