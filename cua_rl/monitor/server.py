"""Our Training Monitor server: the ingest API ``cua_rl.monitor.client`` speaks, a screenshot store, and the
trajectory viewer (JSON API + pages).

Routes:
- ``POST /api/ingest/batch``  bearer project token; body of docs/protocols.md §4.1
- ``PUT  /api/blobs/{sha256}`` bearer project token; raw PNG/JPEG/WebP bytes whose SHA-256 is the name
- ``GET  /api/trainings[/{id}]``, ``/api/{steps|evals|baselines}/{id}``, ``/api/rollouts/{id}``: viewer JSON
- ``GET  /api/trainings/{id}/rollouts?offset=&limit=&task=&status=&source=&min_reward=&max_reward=``: a page
  of a run's rollouts, filtered; ``/api/trainings/{id}/rollouts.csv`` and ``.jsonl``: all of them (same filters)
- ``GET  /``, ``/{training_id}`` (the client's UI link), ``/steps/{id}``, ``/evals/{id}``, ``/baselines/{id}``,
  ``/rollouts/{id}``: pages; ``/blobs/{sha256}``: screenshots; ``/healthz``.

Why reads are open and writes need a token: the server binds 127.0.0.1 unless told otherwise, and a team
server shows runs to the team; only ingest changes anything. A team server that must not show its runs to
everyone who can reach it takes a read token (``read_token``): every read then needs it, as a bearer token
or the cookie that opening any page with ``?token=...`` once sets. Bad input gets a 4xx whose ``detail`` says
what is wrong, and changes nothing (validation before the transaction, one transaction per batch). The
token is never echoed, logged or stored in plain text.
"""

from __future__ import annotations

import csv
import hmac
import io
import json
import logging
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
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


READ_COOKIE = "cua_monitor_read"


def _read_guard(app: FastAPI, read_token: str) -> None:
    """Every GET (pages, JSON, screenshots; not /healthz) needs ``read_token``: ``Authorization: Bearer`` or
    the cookie. ``?token=`` on any page sets the cookie (HttpOnly) and redirects to the page without it, so the
    token leaves the address bar and the server's access log. Writes keep their project tokens."""
    expected = read_token.encode()

    def ok(given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), expected)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.method not in ("GET", "HEAD") or request.url.path == "/healthz":
            return await call_next(request)
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if ok(request.cookies.get(READ_COOKIE)) or (scheme.lower() == "bearer" and ok(bearer.strip())):
            return await call_next(request)
        if ok(request.query_params.get("token")):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + urlencode(rest) if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(READ_COOKIE, read_token, httponly=True, samesite="strict")
            return response
        return _error(401, "this monitor needs its read token: open any page once with ?token=<read token>, "
                           "or send Authorization: Bearer <read token>")


def _json(data: Any) -> Response:
    """The viewer's JSON, encoded by ``json`` directly: the store's values are already plain (strings, numbers,
    parsed JSON columns), and FastAPI's generic encoder took most of a long run's page time (bench/monitor_pages_bench.py)."""
    return Response(json.dumps(data, default=str, separators=(",", ":")), media_type="application/json")


# A cell starting with one of these is a formula to a spreadsheet (OWASP's "CSV injection"): task names and
# keys come from the gym, group ids from the workflow, so an export could carry "=HYPERLINK(...)" into Excel.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A text ``value`` as a spreadsheet shows it, never runs it: a leading ``'`` when it starts like a formula
    (OWASP's rule). Numbers stay numbers (a negative advantage is a number, not a formula)."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def _csv_lines(rows) -> Any:
    buf = io.StringIO()
    out = csv.DictWriter(buf, fieldnames=views.EXPORT_COLUMNS)
    out.writeheader()
    for i, row in enumerate(rows, 1):
        out.writerow({k: csv_cell(v) for k, v in row.items()})
        if i % 500 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def _jsonl_lines(rows) -> Any:
    for row in rows:
        yield json.dumps(row, default=str) + "\n"


def build_app(store: Store, blobs: BlobStore, *, refresh_s: float = 3.0, read_token: str | None = None) -> FastAPI:
    app = FastAPI(title="cua-rl Training Monitor", docs_url=None, redoc_url=None, openapi_url=None)
    limit_body(app, MAX_BODY_BYTES, routes={"/api/blobs/": MAX_BLOB_BYTES})
    if read_token:
        _read_guard(app, read_token)

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
    async def found(fn, *args) -> Response:
        result = await run_in_threadpool(fn, *args)
        if result is None:
            raise HTTPException(404, "not found")
        return _json(result)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    @app.get("/api/trainings")
    async def list_trainings():
        return _json(await run_in_threadpool(views.trainings, store))

    @app.get("/api/trainings/{training_id}")
    async def get_training(training_id: RowId):
        return await found(views.training, store, training_id)

    def filters(task: str | None = None, status: str | None = None, source: str | None = None,
                min_reward: float | None = None, max_reward: float | None = None) -> dict[str, Any]:
        return {"task": task, "status": status, "source": source, "min_reward": min_reward, "max_reward": max_reward}

    @app.get("/api/trainings/{training_id}/rollouts")
    async def list_rollouts(training_id: RowId, offset: Annotated[int, Query(ge=0, le=INT_MAX)] = 0,
                            limit: Annotated[int, Query(ge=1, le=views.PAGE_MAX)] = 50,
                            task: str | None = None, status: str | None = None, source: str | None = None,
                            min_reward: float | None = None, max_reward: float | None = None):
        return await found(lambda: views.rollouts_page(store, training_id, offset=offset, limit=limit,
                                                        **filters(task, status, source, min_reward, max_reward)))

    @app.get("/api/trainings/{training_id}/rollouts.{fmt}")
    async def export_rollouts(training_id: RowId, fmt: str, task: str | None = None, status: str | None = None,
                              source: str | None = None, min_reward: float | None = None,
                              max_reward: float | None = None):
        if fmt not in ("csv", "jsonl"):
            raise HTTPException(404, "export as rollouts.csv or rollouts.jsonl")
        if await run_in_threadpool(views.training_exists, store, training_id) is False:
            raise HTTPException(404, "not found")
        rows = views.rollouts_export(store, training_id, **filters(task, status, source, min_reward, max_reward))
        lines = _csv_lines(rows) if fmt == "csv" else _jsonl_lines(rows)
        return StreamingResponse(lines, media_type="text/csv" if fmt == "csv" else "application/x-ndjson",
                                 headers={"Content-Disposition": f'attachment; filename="run-{training_id}-rollouts.{fmt}"'})

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
