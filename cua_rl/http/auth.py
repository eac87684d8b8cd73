"""Who may use our services: a bearer token for the gym and the agent service, and JSON-only state changes.

Why: a gym or agent service on a network address (docs/cluster.md serves them on ``0.0.0.0``; Ray gyms bind the
node's address) answered anyone: any client could fork, act on or end any execution, and a web page open in a
researcher's browser could create executions with a ``text/plain`` POST (a "simple" cross-origin request, sent
without a CORS preflight). Two rules, installed by ``protect(app, token)`` on both servers:

- with a token, every route but ``/health`` answers **401** unless the request carries
  ``Authorization: Bearer <token>`` (compared in constant time). A browser cannot add that header to a
  cross-origin request without a preflight, and the servers answer no CORS, so no web page can send it;
- every state-changing request (POST, PUT, PATCH, DELETE) must say ``Content-Type: application/json``, with a
  body or without one, else **415**: no web page can send that without a preflight either, so this is the
  defence of a loopback service without a token.

Where tokens come from: ``CUA_GYM_TOKEN`` / ``CUA_AGENT_TOKEN`` (the value), else ``CUA_GYM_TOKEN_FILE`` /
``CUA_AGENT_TOKEN_FILE`` (a file holding it); the servers also take ``--token-file``. The clients (``GenvClient``,
``MiniAgentClient``, the gym fleet) read the same variables, so whatever starts a client and a server gives both
the same environment. A token is never logged, put on a command line or written under the run's logs.

``serving_token`` (with ``exposure_error``) is the start-up rule of both CLIs: a service on an address other than
loopback needs a token, or an explicit ``--insecure-no-token`` (which ``insecure_warning`` makes loud).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from starlette.responses import JSONResponse

GYM_TOKEN = "CUA_GYM_TOKEN"
AGENT_TOKEN = "CUA_AGENT_TOKEN"
OPEN_PATHS = frozenset({"/health"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class TokenError(ValueError):
    """A token that cannot be read (a missing or empty file); the message names the file, never a token."""


def read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path`` (surrounding whitespace dropped); ``TokenError`` when it is missing or empty."""
    try:
        token = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise TokenError(f"the token file {path} is empty")
    return token


def token_from_env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``$name``, else the contents of the file ``$name_FILE``, else None."""
    environ = os.environ if environ is None else environ
    value = environ.get(name, "").strip()
    if value:
        return value
    file = environ.get(f"{name}_FILE", "").strip()
    return read_token_file(file) if file else None


def new_token() -> str:
    """A fresh random token (256 bits) for a stack that starts both ends itself."""
    return secrets.token_urlsafe(32)


def bearer(token: str | None) -> dict[str, str]:
    """The request headers that carry ``token`` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (what a server binds) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:   # a host name: it may resolve to any address
        return False


def exposure_error(prog: str, host: str, token: str | None, insecure: bool, env_name: str) -> str | None:
    """Why ``prog`` must not serve on ``host``: an address other than loopback without a token and without
    ``--insecure-no-token``. None when it may."""
    if token or insecure or is_loopback(host):
        return None
    return (f"{prog}: refusing to serve on {host} without a token: anyone who reaches that address could start, "
            f"drive, read and end anyone's work. Give one with --token-file FILE or {env_name} (clients send it "
            f"from the same variable; docs/security.md), or serve on 127.0.0.1, or pass --insecure-no-token on a "
            f"network you trust")


def serving_token(prog: str, host: str, token_file: str | None, insecure: bool, env_name: str,
                  logger: logging.Logger) -> str | None:
    """The token ``prog serve`` guards its routes with: ``--token-file``, else ``env_name`` (or its ``_FILE``);
    ``TokenError`` with the reason when it cannot read one or must not serve on ``host`` without one (logs the
    loud line when ``--insecure-no-token`` lets it)."""
    token = read_token_file(token_file) if token_file else token_from_env(env_name)
    refused = exposure_error(prog, host, token, insecure, env_name)
    if refused:
        raise TokenError(refused.removeprefix(f"{prog}: "))
    if insecure and not token:
        logger.warning(insecure_warning(prog, host))
    return token


def insecure_warning(prog: str, host: str) -> str:
    """The line a service logs at WARNING when it serves on a network without a token."""
    return (f"{prog} serves on {host} WITHOUT A TOKEN (--insecure-no-token): anyone who reaches this "
            f"address can do what its clients do: start, drive, read and end anyone's work (docs/security.md)")


class Guard:
    """ASGI middleware of ``protect``: the token check (when there is a token), then the JSON-only rule."""

    def __init__(self, app, token: str | None = None) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in OPEN_PATHS \
                and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            detail = ("this service needs a bearer token: Authorization: Bearer <token> (its clients read "
                      "CUA_GYM_TOKEN or CUA_AGENT_TOKEN; docs/security.md)")
            await JSONResponse({"detail": detail}, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        if scope["type"] == "http" and scope["method"] in STATE_CHANGING and not _is_json(headers):
            detail = ("state-changing requests must send Content-Type: application/json (a body is optional), "
                      f"not {headers.get(b'content-type', b'none').decode('latin-1')[:100]!r}")
            await JSONResponse({"detail": detail}, 415)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _is_json(headers: dict[bytes, bytes]) -> bool:
    media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
    return media == b"application/json"


def protect(app, token: str | None) -> None:
    """Install ``Guard`` on the FastAPI ``app``, outside every other middleware (call it last): a stranger's
    request is refused before its body is read."""
    app.add_middleware(Guard, token=token)
