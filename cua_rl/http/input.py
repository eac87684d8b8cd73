"""Bounds on untrusted HTTP input, shared by every service we run: a request-body cap and bounded JSON.

Why one module: the gym, the agent service, the Training Monitor and the policy endpoint all take bodies
from callers they do not control, and bad input must get a clear 4xx and change nothing (docs/protocols.md §5).
Two failure modes are common to all of them and easy to get subtly different per service:

- a body too large to buffer: ``BodyLimit`` (ASGI middleware for the FastAPI services) answers **413** naming
  the cap, from the ``Content-Length`` header before anything is read, or while reading a chunked body;
- JSON nested so deep that Python's parser raises ``RecursionError`` (a 500 where it is not caught) or that
  later recursive code chokes on: ``parse_json`` raises ``BadJSON`` (a ``ValueError``) saying why.

The policy endpoint is aiohttp, whose ``client_max_size`` plays the part of ``BodyLimit``; it uses
``parse_json`` and ``too_large_message`` from here so its answers read the same.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

# Our own payloads nest at most ~15 levels (an OpenAI tool's JSON schema, a Hydra config); 64 leaves room
# and still keeps every recursive consumer (pydantic, jinja, SQL JSON encoders) far from Python's limit.
MAX_JSON_DEPTH = 64
MiB = 1024 * 1024


class BadJSON(ValueError):
    """A body that is not usable JSON; the message says why and is safe to return to the caller."""


def too_large_message(limit: int, size: int | None = None) -> str:
    got = f"of {size} bytes " if size is not None else ""
    return f"request body {got}exceeds the limit of {limit} bytes ({limit / MiB:g} MiB) for this endpoint"


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether containers in ``value`` nest deeper than ``limit`` (iterative: safe on any input)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that raises ``BadJSON`` for invalid JSON, bad UTF-8 and nesting past ``max_depth``."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadJSON(f"JSON nested too deeply (at most {max_depth} levels)") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise BadJSON(f"body is not valid JSON: {exc}") from None
    if too_deep(value, max_depth):
        raise BadJSON(f"JSON nested too deeply (at most {max_depth} levels)")
    return value


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` (``routes``: a larger or smaller cap per path prefix) get
    413 ``{"detail": ...}``; the app behind it never sees them. Install with ``limit_body(app, ...)``."""

    def __init__(self, app, max_bytes: int, routes: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Longest prefix first, so "/api/blobs/" wins over "/api/".
        self.routes = sorted((routes or {}).items(), key=lambda kv: -len(kv[0]))

    def limit_for(self, path: str) -> int:
        return next((cap for prefix, cap in self.routes if path.startswith(prefix)), self.max_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await JSONResponse({"detail": too_large_message(limit, int(declared))}, 413)(scope, receive, send)
            return
        seen = 0

        async def capped_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:  # a chunked body, or one longer than it declared
                raise HTTPException(413, too_large_message(limit))
            return message

        await self.app(scope, capped_receive, send)


def limit_body(app, max_bytes: int, routes: dict[str, int] | None = None) -> None:
    """Cap request bodies of the FastAPI/Starlette ``app`` (see ``BodyLimit``); a caller that hangs up while
    its body is read (an agent run cancelled at shutdown) ends that request quietly, not as a traceback."""
    app.add_middleware(BodyLimit, max_bytes=max_bytes, routes=routes)
    app.add_exception_handler(ClientDisconnect, _client_gone)


async def _client_gone(request, exc) -> JSONResponse:
    return JSONResponse({"detail": "the client closed the request before its body was read"}, status_code=400)
