"""TEST DOUBLE standing in for the closed-source gbox-mini-agent (docs/protocols.md §2), until the
embedded agent service (cua_rl.local_agent) lands and for shapes it will not emit (old ``turn_*``
events, 0-based steps, bare lists).

A run replays a scripted list of events: each events poll reveals ``reveal_per_poll`` more, status is
``running`` until all are revealed and then ``final_status``. ``from`` is honoured inclusively, as
documented, so the client must de-duplicate. Every request is recorded. ``fail_next`` answers statuses and
``encoded_next`` bodies with a ``Content-Encoding`` (a compression bomb: tests/doubles/bombs.py) first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response


def ts(i: int) -> str:
    return f"2026-01-01T00:00:{i // 1000:02d}.{i % 1000:03d}Z"


def scripted_events(num_steps: int, *, zero_based: bool = False, old_names: bool = False,
                    answer: str | None = "done", ok: bool = True) -> list[dict]:
    """A plausible run: per step start, model_call, model_output, action_executed, end; then run_end."""
    start, end = ("turn_start", "turn_end") if old_names else ("step_start", "step_end")
    events, t = [], 0
    for i in range(num_steps):
        step = i if zero_based else i + 1
        last = i == num_steps - 1
        action = ({"name": "finished", "args": {"content": answer}} if last and answer is not None
                  else {"name": "click", "args": {"point": {"x": 0.5, "y": 0.5}}})
        for event in ({"type": start}, {"type": "model_call", "modelSpecificInput": {"messages": []}},
                      {"type": "model_output", "modelOutput": {"choices": [{"message": {"content": f"s{step}"}}]}},
                      {"type": "action_executed", "actionIndex": 0, "action": action}, {"type": end}):
            t += 1
            events.append({**event, "ts": ts(t), "step": step})
    events.append({"type": "run_end", "ts": ts(t + 1), "ok": ok, "reason": "finished" if ok else "gave up"})
    return events


@dataclass
class AgentState:
    script: list = field(default_factory=lambda: scripted_events(2))
    reveal_per_poll: int = 4
    final_status: str = "completed"
    final_reason: str | None = None
    status_answer: str | None = None  # the embedded service also reports the answer in GET /runs/{id}
    wrap_events: bool = True
    steps: list | None = field(default_factory=lambda: [{"actions": [], "text": "s1"}, {"actions": [], "text": "s2"}])
    endless: bool = False
    empty_polls: int = 0  # the first N events polls answer 404 ("no events yet")
    fail_next: dict = field(default_factory=dict)
    # (method, path suffix) -> [(body, coding), ...]: answered verbatim with that Content-Encoding (a bomb)
    encoded_next: dict = field(default_factory=dict)
    runs: dict = field(default_factory=dict)
    payloads: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    cancelled: list = field(default_factory=list)


def build_agent_double(state: AgentState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record_and_inject(request: Request, call_next):
        state.requests.append((request.method, request.url.path, dict(request.query_params)))
        for (method, suffix), answers in state.encoded_next.items():
            if request.method == method and request.url.path.endswith(suffix) and answers:
                body, coding = answers.pop(0)
                return Response(body, media_type="application/json", headers={"Content-Encoding": coding})
        for (method, suffix), statuses in state.fail_next.items():
            if request.method == method and request.url.path.endswith(suffix) and statuses:
                return JSONResponse({"detail": f"injected failure {statuses[0]}"}, status_code=statuses.pop(0))
        return await call_next(request)

    def run_or_404(run_id: str) -> dict:
        if run_id not in state.runs:
            raise HTTPException(404, f"run {run_id} not found")
        return state.runs[run_id]

    @app.post("/runs")
    async def start(request: Request):
        payload = await request.json()
        state.payloads.append(payload)
        if payload.get("task") == "echo":  # a careless server echoing the body in a 422
            raise HTTPException(422, f"invalid run: {payload}")
        if payload.get("standardActionSpace") not in ("mobile", "pc"):
            raise HTTPException(400, "bad standardActionSpace")
        run_id = f"run-{len(state.runs) + 1}"
        state.runs[run_id] = {"revealed": 0, "cancelled": False, "polls": 0}
        return {"runId": run_id}

    @app.get("/runs/{run_id}")
    async def status(run_id: str):
        run = run_or_404(run_id)
        if run["cancelled"]:
            return {"status": "failed", "reason": "cancelled"}
        if state.endless or run["revealed"] < len(state.script):
            return {"status": "running"}
        extra = {"reason": state.final_reason} if state.final_reason else {}
        if state.status_answer:
            extra["answer"] = state.status_answer
        return {"status": state.final_status, **extra}

    @app.get("/runs/{run_id}/events")
    async def events(run_id: str, request: Request):
        run = run_or_404(run_id)
        run["polls"] += 1
        if run["polls"] <= state.empty_polls:
            raise HTTPException(404, "no events yet")
        if not state.endless:
            run["revealed"] = min(len(state.script), run["revealed"] + state.reveal_per_poll)
        visible = state.script[: run["revealed"]]
        if not visible:
            raise HTTPException(404, "no events yet")
        start = request.query_params.get("from")
        if start is not None:
            visible = [e for e in visible if str(e["ts"]) >= start]  # inclusive, as documented
        return {"events": visible} if state.wrap_events else visible

    @app.get("/runs/{run_id}/steps")
    async def steps(run_id: str):
        run_or_404(run_id)
        if state.steps is None:
            raise HTTPException(404, "no steps")
        return {"steps": state.steps}

    @app.post("/runs/{run_id}/cancel")
    async def cancel(run_id: str):
        run = run_or_404(run_id)
        run["cancelled"] = True
        state.cancelled.append(run_id)
        return {"ok": True}

    return app
