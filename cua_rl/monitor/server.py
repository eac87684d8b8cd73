"""Our Training Monitor server: the ingest API ``cua_rl.monitor.client`` speaks, a screenshot store, and the
trajectory viewer (JSON API + pages).

Routes:
- ``POST /api/ingest/batch``  bearer project token; body of docs/protocols.md §4.1
- ``PUT  /api/blobs/{sha256}`` bearer project token; raw PNG/JPEG/WebP bytes whose SHA-256 is the name
- ``GET  /api/trainings[/{id}]``, ``/api/{steps|evals|baselines}/{id}``, ``/api/rollouts/{id}``: viewer JSON
- ``GET  /``, ``/{training_id}`` (the client's UI link), ``/steps/{id}``, ``/evals/{id}``, ``/baselines/{id}``,
  ``/rollouts/{id}``: pages; ``/blobs/{sha256}``: screenshots; ``/healthz``.

Why reads are open and writes need a token: the server binds 127.0.0.1 unless told otherwise, and a team
server shows runs to the team; only ingest changes anything. Bad input gets a 4xx whose ``detail`` says
what is wrong, and changes nothing (validation before the transaction, one transaction per batch). The
token is never echoed, logged or stored in plain text.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Path, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..http.input import BadJSON, limit_body, parse_json
from . import views
from .blobs import MAX_BLOB_BYTES, BlobError, BlobStore
from .ingest import IngestError, parse_batch
from .schema import INT_MAX
from .store import Store

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
# A row id in a path: out of the column's range is a 422, not a driver overflow (a 500).
RowId = Annotated[int, Path(ge=1, le=INT_MAX)]
STATIC = resources.files(__package__) / "ui"
_STATIC_TYPES = {"js": "text/javascript", "css": "text/css", "html": "text/html"}


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def build_app(store: Store, blobs: BlobStore, *, refresh_s: float = 3.0) -> FastAPI:
    app = FastAPI(title="cua-rl Training Monitor", docs_url=None, redoc_url=None, openapi_url=None)
    limit_body(app, MAX_BODY_BYTES, routes={"/api/blobs/": MAX_BLOB_BYTES})

    async def project_of(request: Request) -> int:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "missing bearer token (Authorization: Bearer <project token>)")
        project = await run_in_threadpool(store.project_for_token, token.strip())
        if project is None:
            raise HTTPException(401, "invalid project token")
        return project

    # ---- writes -----------------------------------------------------------------------------------
    @app.post("/api/ingest/batch")
    async def ingest(request: Request):
        project = await project_of(request)
        try:
            body = parse_json(await request.body())
        except BadJSON as exc:
            return _error(400, str(exc))
        try:
            batch = parse_batch(body)
            return await run_in_threadpool(store.ingest, project, batch)
        except IngestError as exc:
            return _error(exc.status, str(exc))

    @app.put("/api/blobs/{sha256}")
    async def put_blob(sha256: str, request: Request):
        await project_of(request)
        data = await request.body()
        try:
            created = await run_in_threadpool(blobs.put, sha256, data)
        except BlobError as exc:
            return _error(exc.status, str(exc))
        return JSONResponse({"sha256": sha256, "created": created}, status_code=201 if created else 200)

    # ---- reads ------------------------------------------------------------------------------------
    async def found(fn, *args) -> Any:
        result = await run_in_threadpool(fn, *args)
        if result is None:
            raise HTTPException(404, "not found")
        return result

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    @app.get("/api/trainings")
    async def list_trainings():
        return await run_in_threadpool(views.trainings, store)

    @app.get("/api/trainings/{training_id}")
    async def get_training(training_id: RowId):
        return await found(views.training, store, training_id)

    @app.get("/api/{kind}/{parent_id}")
    async def get_groups(kind: str, parent_id: RowId):
        if kind == "rollouts":
            return await found(views.rollout, store, parent_id)
        if kind not in ("steps", "evals", "baselines"):
            raise HTTPException(404, "not found")
        return await found(views.groups, store, kind, parent_id)

    @app.get("/blobs/{sha256}")
    async def get_blob(sha256: str):
        hit = blobs.find(sha256)
        if hit is None:
            raise HTTPException(404, "no such screenshot")
        # Content-addressed: the bytes behind a name never change.
        return FileResponse(hit[0], media_type=hit[1], headers={"Cache-Control": "public, max-age=31536000, immutable"})

    @app.get("/static/{name}")
    async def static(name: str):
        ext = name.rsplit(".", 1)[-1]
        item = STATIC / name
        if "/" in name or ext not in _STATIC_TYPES or not item.is_file():
            raise HTTPException(404, "not found")
        return Response(item.read_bytes(), media_type=_STATIC_TYPES[ext])

    page = (STATIC / "page.html").read_text().replace("{{REFRESH_MS}}", str(int(refresh_s * 1000)))

    def html() -> HTMLResponse:
        return HTMLResponse(page)

    for path in ("/", "/steps/{pid}", "/evals/{pid}", "/baselines/{pid}", "/rollouts/{pid}"):
        app.add_api_route(path, html, methods=["GET"], response_class=HTMLResponse)

    @app.get("/{training_id}")
    async def run_page(training_id: RowId):  # the client's UI link: {base}/{training_id}?project_id=...
        return html()

    return app
