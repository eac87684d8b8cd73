"""TEST DOUBLE standing in for a remote genv gym server, until the embedded gym (cua_rl.local_gym) lands.

It follows the documented shapes of docs/protocols.md §1.1-1.6 (FastAPI-style
``{"detail": ...}`` errors) and records every request, so client tests exercise real HTTP on loopback.
Fault injection: ``fail_next[(method, path_suffix)] = [status, ...]`` answers those statuses first;
``encoded_next[(method, path_suffix)] = [(body, coding), ...]`` answers those bodies verbatim with that
``Content-Encoding`` (a hostile gym's compression bomb: tests/doubles/bombs.py).

It also plays a bad gym host of a fleet (cua_rl/genv/fleet.py; tests/genv/test_fleet.py): a third-party gym on
the network, which may answer anything. ``capacity`` is what ``GET /api/v1/{gym}/capacity`` answers (None: the
route is missing, 404, as on a genv gym; a dict: as JSON; a str: that text verbatim, for values JSON has no
Python spelling of, such as ``1e999``); ``create_status`` makes every create answer that status.

It also plays a third-party gym for ``cua-gym check`` (cua_rl/genv/conformance.py; tests/genv/test_conformance.py):
with ``refuse_unknown`` it answers 404 to a create of a task it does not list and to any call on an execution it
never made (as docs/protocols.md §1.8 asks; off by default, the client tests create any task id), ``missing``
names routes it lacks (``evaluate``, ``screenshot``, ...: answered 404 Not Found as by a server without them), and
``accept_bad_actions`` answers 200 ``{"ok": true}`` to any action, an unknown type included (a half-broken gym).
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

PNG_1x1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")


@dataclass
class GymState:
    tasks: list | dict = field(default_factory=lambda: {"tasks": [
        {"task_id": "task-001", "name": "Open settings", "description": "Open the settings app",
         "tags": ["easy", "settings"], "env_config": {"app": "settings"}, "evaluation": {"checks": []}},
        {"id": "6f1c2d3e-0000-4000-8000-00000000abcd", "meta": {"number": "012", "displayName": "Write note"},
         "instruction": "Write a note", "tags": ["hard"]},
    ]})
    evaluation_reply: dict = field(default_factory=lambda: {"success": True, "result": {"score": 0.0}})
    create_reply: dict | None = None
    requests: list = field(default_factory=list)
    fail_next: dict = field(default_factory=dict)
    # (method, path suffix) -> [(body, coding), ...]: answered verbatim with that Content-Encoding (a bomb)
    encoded_next: dict = field(default_factory=dict)
    delay_s: dict = field(default_factory=dict)
    executions: dict = field(default_factory=dict)
    terminated: list = field(default_factory=list)
    screenshot_as_data_uri: bool = False  # older gyms answer {"data_uri": ...} instead of bytes
    capacity: dict | str | None = None    # GET .../capacity: None 404 (no route), a dict as JSON, a str verbatim
    create_status: int | None = None      # every create answers this status (a host whose creates fail)
    refuse_unknown: bool = False          # 404 for an unknown task's create and an unknown execution
    missing: set = field(default_factory=set)   # route names answered 404 Not Found (see the docstring)
    accept_bad_actions: bool = False      # any action is answered {"ok": true}: bad input answered 200

    def creates(self) -> int:
        """Create requests received so far."""
        return sum(1 for method, path, _q, _b in self.requests if method == "POST" and "/tasks/" in path)


_ON_EXECUTION = {"execution", "screenshot", "actions", "evaluate", "terminate"}


def _route_name(method: str, path: str) -> str:
    """``tasks``, ``task``, ``create``, ``capacity``, ``execution``, ``screenshot``, ``actions``, ``evaluate`` or
    ``terminate`` for a path under ``/api/v1/{gym}/`` ("" otherwise)."""
    parts = path.strip("/").split("/")[3:]
    if parts == ["tasks"] or parts == ["capacity"]:
        return parts[0]
    if len(parts) == 2 and parts[0] == "tasks":
        return "create" if method == "POST" else "task"
    if len(parts) >= 2 and parts[0] == "executions":
        return "execution" if len(parts) == 2 else parts[2]
    return ""


def build_gym_double(state: GymState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record_and_inject(request: Request, call_next):
        body = await request.body()
        state.requests.append((request.method, request.url.path, dict(request.query_params), body))
        for (method, suffix), answers in state.encoded_next.items():
            if request.method == method and request.url.path.endswith(suffix) and answers:
                body, coding = answers.pop(0)
                return Response(body, media_type="application/json", headers={"Content-Encoding": coding})
        for (method, suffix), statuses in state.fail_next.items():
            if request.method == method and request.url.path.endswith(suffix) and statuses:
                return JSONResponse({"detail": f"injected failure {statuses[0]}"}, status_code=statuses.pop(0))
        route = _route_name(request.method, request.url.path)
        if route in state.missing:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if state.refuse_unknown and route in _ON_EXECUTION and request.url.path.split("/")[5] not in state.executions:
            return JSONResponse({"detail": "unknown execution"}, status_code=404)
        for (method, suffix), delay in state.delay_s.items():
            if request.method == method and request.url.path.endswith(suffix):
                await asyncio.sleep(delay)
        return await call_next(request)

    @app.get("/api/v1/{gym}/tasks")
    async def list_tasks(gym: str):
        return state.tasks

    @app.get("/api/v1/{gym}/tasks/{task_id}")
    async def get_task(gym: str, task_id: str):
        tasks = state.tasks["tasks"] if isinstance(state.tasks, dict) else state.tasks
        for task in tasks:
            if task_id in (task.get("task_id"), task.get("id")):
                return {"task": task}
        raise HTTPException(404, f"task {task_id} not found")

    @app.get("/api/v1/{gym}/capacity")
    async def capacity(gym: str):
        if state.capacity is None:
            raise HTTPException(404, "Not Found")
        if isinstance(state.capacity, str):
            return Response(state.capacity, media_type="application/json")
        return state.capacity

    @app.post("/api/v1/{gym}/tasks/{task_id}")
    async def create(gym: str, task_id: str):
        if state.create_status is not None:
            raise HTTPException(state.create_status, f"create refused ({state.create_status})")
        if state.create_reply is not None:
            return state.create_reply
        listed = state.tasks["tasks"] if isinstance(state.tasks, dict) else state.tasks
        if state.refuse_unknown and task_id not in {t.get("task_id") or t.get("id") for t in listed}:
            raise HTTPException(404, f"unknown task {task_id}")
        eid = f"exec-{len(state.executions) + 1}"
        state.executions[eid] = task_id
        return {"execution_id": eid, "task_id": task_id, "device": {"device_serial": "emulator-5554"}}

    @app.get("/api/v1/{gym}/executions/{eid}")
    async def get_execution(gym: str, eid: str):
        if eid not in state.executions:
            raise HTTPException(404, f"execution {eid} not found")
        return {"execution_id": eid, "status": "running", "task_id": state.executions[eid],
                "screen": {"width": 1280, "height": 800}}

    @app.get("/api/v1/{gym}/executions/{eid}/screenshot")
    async def screenshot(gym: str, eid: str, format: str = "png"):
        if state.screenshot_as_data_uri:
            return {"data_uri": "data:image/png;base64," + base64.b64encode(PNG_1x1).decode()}
        return Response(PNG_1x1, media_type=f"image/{format}")

    @app.post("/api/v1/{gym}/executions/{eid}/actions")
    async def act(gym: str, eid: str, request: Request):
        action = (await request.json()).get("action") or {}
        if state.accept_bad_actions:
            return {"ok": True, "screen_changed": False}
        if action.get("type") not in {"click", "move", "drag", "scroll", "type", "key", "wait"}:
            raise HTTPException(422, f"unknown action type {action.get('type')!r}")
        return {"ok": True, "screen_changed": action["type"] != "wait"}

    @app.post("/api/v1/{gym}/executions/{eid}/evaluate")
    async def evaluate(gym: str, eid: str):
        return state.evaluation_reply

    @app.post("/api/v1/{gym}/executions/{eid}/terminate")
    async def terminate(gym: str, eid: str):
        state.terminated.append(eid)
        return {"ok": True}

    return app
