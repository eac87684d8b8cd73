"""TEST DOUBLE standing in for the remote Training Monitor (its server is not public; docs/protocols.md
§4 follows the Python client). Serves ``POST {prefix}/api/ingest/batch`` behind a bearer token,
upserts rows by ``client_id`` per kind and answers ``{"training_id"}`` / ``{kind: [{client_id, id}]}``.
Fault injection: ``fail_next`` = statuses to answer first; ``delay_first_s`` stalls the first request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

KINDS = ("tasks", "validators", "environments", "steps", "baselines", "evals", "rollouts", "turns", "actions",
         "observations", "validations")


@dataclass
class MonitorState:
    token: str = "tok-SECRET-xyz"
    prefix: str = "/178"
    rows: dict = field(default_factory=lambda: {k: {} for k in KINDS})
    trainings: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    fail_next: list = field(default_factory=list)
    delay_first_s: float = 0.0
    next_id: int = 1


def build_monitor_double(state: MonitorState) -> FastAPI:
    app = FastAPI()

    @app.post(state.prefix + "/api/ingest/batch")
    async def ingest(request: Request):
        state.requests.append(dict(request.headers))
        if state.delay_first_s and len(state.requests) == 1:
            await asyncio.sleep(state.delay_first_s)
        if request.headers.get("authorization") != f"Bearer {state.token}":
            # a careless server echoing the credential: the client must still not log it
            return JSONResponse({"detail": f"bad token {request.headers.get('authorization')}"}, status_code=401)
        if state.fail_next:
            return JSONResponse({"detail": "injected failure"}, status_code=state.fail_next.pop(0))
        body = await request.json()
        reply: dict = {}
        if "training" in body:
            training = body["training"]
            tid = training.get("training_id") or len(state.trainings) + 1
            state.trainings.setdefault(tid, {}).update(training)
            reply["training_id"] = tid
        for kind in KINDS:
            for row in body.get(kind, []):
                table = state.rows[kind]
                if row["client_id"] not in table:
                    table[row["client_id"]] = {"id": state.next_id}
                    state.next_id += 1
                table[row["client_id"]].update(row)
                reply.setdefault(kind, []).append({"client_id": row["client_id"],
                                                   "id": table[row["client_id"]]["id"]})
        return reply

    return app
