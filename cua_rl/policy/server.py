"""The HTTP side of the policy endpoint: one aiohttp server per event loop, routing by bearer key.

Why per event loop: AReaL runs every rollout of an inference engine on one background event loop
(``AsyncTaskRunner``); ``engine.agenerate`` and its shared aiohttp session belong to that loop, so the
server answering the agent must live there too. It is started lazily by the first episode and closed by
AReaL's loop-cleanup hook when the runner shuts down. Train and eval engines have separate loops and
therefore separate servers. The server knows nothing of the endpoint: whoever opens an episode registers its
key with the handler that answers it (``register``) and revokes it when the episode ends (``unregister``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, NamedTuple

from aiohttp import web

from ..http.input import BadJSON, MiB, parse_json, too_large_message

logger = logging.getLogger(__name__)

# A request carries the agent's screenshot history as base64 data URLs. A full-HD PNG screenshot is 0.1-2 MB
# in practice and at worst (incompressible pixels) 6.2 MB, 8.3 MB as base64: 64 MiB takes seven worst-case
# full-HD screenshots, or three at the per-image cap (``image_fetch_max_bytes``, 20 MiB), in one request.
MAX_BODY_BYTES = 64 * MiB


def error_body(status: int, message: str, kind: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object (``{"error": {"message", "type", "code"}}``): the one builder of it. ``code``:
    OpenAI's error code where one applies (``context_length_exceeded``), else the status."""
    return {"error": {"message": message, "type": kind, "code": code or status}}


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response(error_body(status, message, kind), status=status)


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


class Answer(NamedTuple):
    """A handler's reply. ``delivered`` (when given) is told whether the reply reached the client: an answer
    the agent never received (it stopped waiting, e.g. its step time limit, or its connection broke and it
    retried) must not be recorded as a turn the agent played."""

    status: int
    payload: dict[str, Any]
    delivered: Callable[[bool], None] | None = None


# Answers one chat completion request body of a key's episode.
Handler = Callable[[dict[str, Any]], Awaitable[Answer]]


class Route(NamedTuple):
    handler: Handler
    model: str      # the model name the key's episode is served as (``GET /models``)


@dataclass
class LoopServer:
    """A running server; ``port`` is the bound port, ``routes`` maps the registered keys to their routes."""

    host: str
    port: int
    runner: web.AppRunner
    routes: dict[str, Route] = field(default_factory=dict)

    def register(self, key: str, handler: Handler, model: str) -> None:
        """Requests bearing ``key`` are answered by ``handler`` from now on."""
        self.routes[key] = Route(handler, model)

    def unregister(self, key: str) -> None:
        """Revoke ``key``: later requests bearing it get 401 (a second call does nothing)."""
        self.routes.pop(key, None)

    async def close(self) -> None:
        self.routes.clear()
        await self.runner.cleanup()

    # ---- handlers -------------------------------------------------------------------------------
    def _lookup(self, request: web.Request) -> Route | None:
        key = _bearer(request)
        return self.routes.get(key) if key else None

    async def models(self, request: web.Request) -> web.Response:
        # Listing models needs no key: the original client calls GET /models before it has one.
        names = sorted({route.model for route in self.routes.values()}) or ["policy"]
        return web.json_response({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "cua-rl"} for n in names]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        route = self._lookup(request)
        if route is None:
            return openai_error(401, "missing or unknown API key (each episode has its own key)",
                                "authentication_error")
        try:
            body = parse_json(await request.read())
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, too_large_message(MAX_BODY_BYTES, request.content_length))
        except BadJSON as exc:
            return openai_error(400, f"request {exc}")
        if not isinstance(body, dict):
            return openai_error(400, "request body must be a JSON object")
        answer = await route.handler(body)
        if answer.status != 200:
            return web.json_response(answer.payload, status=answer.status)
        if request.transport is None or request.transport.is_closing():   # the client has gone meanwhile
            return _tell(answer, False, web.json_response(answer.payload))
        resp = (web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                if body.get("stream") else web.json_response(answer.payload))
        try:   # written here, not after the handler returns, to know whether it went out
            await resp.prepare(request)
            if body.get("stream"):
                await _stream(resp, answer.payload)
            await resp.write_eof()
        except ConnectionError:
            logger.info("the client went away before its answer was written (status 200 not delivered)")
            return _tell(answer, False, resp)
        except asyncio.CancelledError:
            _tell(answer, False, None)
            raise
        return _tell(answer, True, resp)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "episodes": len(self.routes)})


def _tell(answer: Answer, delivered: bool, resp):
    if answer.delivered is not None:
        answer.delivered(delivered)
    return resp


async def _stream(resp: web.StreamResponse, completion: dict[str, Any]) -> None:
    """Answer ``stream: true`` with the finished completion as one SSE chunk (generation is not
    incremental here; the agent still gets a well-formed stream). Tool calls come whole in that chunk, each
    with its ``index``, as OpenAI's stream deltas carry them (a client joins argument fragments by index)."""
    choice = completion["choices"][0]
    message = choice["message"]
    chunk = {k: completion[k] for k in ("id", "created", "model")}
    chunk["object"] = "chat.completion.chunk"
    delta = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    first = {**chunk, "choices": [{"index": 0, "delta": delta,
                                   "logprobs": choice.get("logprobs"), "finish_reason": None}]}
    last = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": completion.get("usage")}
    for event in (first, last):
        await resp.write(f"data: {json.dumps(event)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")


_servers: dict[tuple[int, str], LoopServer] = {}
_start_lock: dict[int, asyncio.Lock] = {}


async def get_loop_server(host: str, port: int) -> LoopServer:
    """The server of the running loop for ``host``; started on first use (``port`` 0 = any free port;
    a busy fixed port falls back to a free one, with a warning, so train and eval loops can coexist)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), host)
    lock = _start_lock.setdefault(id(loop), asyncio.Lock())
    async with lock:
        server = _servers.get(key)
        if server is not None:
            return server
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        runner = web.AppRunner(app, access_log=None)
        server = LoopServer(host=host, port=0, runner=runner)
        app.router.add_post("/v1/chat/completions", server.chat_completions)
        app.router.add_post("/chat/completions", server.chat_completions)
        app.router.add_get("/v1/models", server.models)
        app.router.add_get("/models", server.models)
        app.router.add_get("/health", server.health)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except OSError as exc:
            if port == 0 or exc.errno != errno.EADDRINUSE:
                await runner.cleanup()
                raise
            logger.warning("policy endpoint port %d is busy on %s; using a free port instead", port, host)
            site = web.TCPSite(runner, host, 0)
            await site.start()
        server.port = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor for it
        _servers[key] = server
        _register_cleanup(loop, key, server)
        logger.info("policy endpoint listening on %s:%d", host, server.port)
        return server


def _register_cleanup(loop, key, server: LoopServer) -> None:
    async def _close() -> None:
        _servers.pop(key, None)
        _start_lock.pop(key[0], None)
        await server.close()

    try:
        from areal.infra.utils.concurrent import register_loop_cleanup

        register_loop_cleanup(_close, loop=loop)
    except Exception:  # outside AReaL's runner (tests): close_loop_servers() does it
        logger.debug("AReaL loop cleanup unavailable; close_loop_servers() must be called")


async def close_loop_servers() -> None:
    """Close the running loop's servers (tests and short-lived scripts; AReaL's runner does it itself)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _servers if k[0] == loop_id]:
        server = _servers.pop(key)
        await server.close()
    _start_lock.pop(loop_id, None)
