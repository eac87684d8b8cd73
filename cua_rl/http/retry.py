"""Bounded retries with exponential backoff for the remote-service clients (genv, mini-agent, monitor).

Why one helper: all three clients talk to services that drop connections under load (the genv gym is
known to answer only one of several parallel requests). Retrying is only safe for calls that do not
change server state twice, so each call site states its own policy: idempotent GETs retry on transport
errors and 5xx; state-changing POSTs (create execution, evaluate, act, start run) pass ``policy=None``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import httpx

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one request.

    attempts: total tries (1 = no retry). Delay before try n+1 is ``backoff_s * 2**(n-1)``, capped at
    ``max_backoff_s``. ``retry_5xx`` adds server errors (500-599) to the transport errors that are retried.
    """

    attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    retry_5xx: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("RetryPolicy backoff values must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to sleep after failed try number ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * (2 ** (attempt - 1)))


class AnswerRefused(Exception):
    """A reply body the caller's bound refuses (``send_with_retry`` with ``max_bytes``): not read on, never
    retried."""


class AnswerTooLarge(AnswerRefused):
    """A reply body past the caller's ``max_bytes``."""


class AnswerEncoded(AnswerRefused):
    """A reply that came compressed (a ``Content-Encoding``) although ``identity`` was asked for: never decoded,
    since a few hundred bytes of stacked gzip or zstd decode to gigabytes at once."""


def _encoded(response: httpx.Response) -> str:
    """The reply's content codings other than ``identity`` ("" when none)."""
    codings = [c.strip() for c in response.headers.get("content-encoding", "").split(",")]
    return ", ".join(c for c in codings if c and c.lower() != "identity")


async def _bounded(client: httpx.AsyncClient, method: str, url: str, max_bytes: int, **kwargs) -> httpx.Response:
    """The response with its body read, but never more than ``max_bytes`` of it: ``AnswerTooLarge``. The body is
    asked for uncompressed (``Accept-Encoding: identity``) and read as it comes over the wire, so the bound holds
    there and after decoding alike; a compressed answer all the same is ``AnswerEncoded``, never decoded."""
    kwargs = dict(kwargs)
    follow = kwargs.pop("follow_redirects", False)
    kwargs["headers"] = {**dict(kwargs.get("headers") or {}), "Accept-Encoding": "identity"}
    request = client.build_request(method, url, **kwargs)
    response = await client.send(request, stream=True, follow_redirects=follow)
    try:
        encoded = _encoded(response)
        if encoded:
            raise AnswerEncoded(f"the reply is compressed (Content-Encoding: {encoded}) although identity was "
                                "asked for; it is not decoded")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerTooLarge(f"the reply declares {int(declared)} bytes; at most {max_bytes} are read")
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > max_bytes:
                raise AnswerTooLarge(f"the reply exceeds {max_bytes} bytes")
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body), request=request)


async def send_with_retry(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    policy: RetryPolicy | None,
    what: str,
    max_bytes: int | None = None,
    **kwargs,
) -> httpx.Response:
    """Send one request, retrying per ``policy`` (``None`` = exactly one try).

    Returns the last response, which may still be a 5xx when the retries are spent (the caller turns it
    into its own error type); re-raises the last ``httpx.TransportError`` (timeouts included) likewise.
    ``max_bytes``: read at most this much of a reply body, on the wire and decoded alike (``AnswerTooLarge``
    past it, ``AnswerEncoded`` for a compressed one: ``_bounded``; neither retried): a service that is not ours
    may answer anything. ``what`` names the call in log lines; never put secrets in it.
    """
    attempts = policy.attempts if policy else 1
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        try:
            if max_bytes is None:
                response = await client.request(method, url, **kwargs)
            else:
                response = await _bounded(client, method, url, max_bytes, **kwargs)
        except httpx.TransportError as exc:
            if last:
                raise
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if not (policy and policy.retry_5xx and response.status_code >= 500) or last:
                return response
            reason = f"HTTP {response.status_code}"
        delay = policy.delay(attempt) if policy else 0.0
        logger.warning("%s failed (%s); retry %d/%d in %.1fs", what, reason, attempt, attempts - 1, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # the loop always returns or raises


def error_detail(response: httpx.Response) -> str:
    """The server's ``detail`` (FastAPI style ``{"detail": ...}``), else the body text, shortened for logs."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)[:500]
    return json.dumps(body)[:500]


def never_sent(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is a failure to connect: the request never reached the
    server, so even a state-changing call may be sent again (the service is down or restarting)."""
    while exc is not None:
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return True
        exc = exc.__cause__
    return False


async def ask_until_done(send: Callable[[], Awaitable[T]], *, nothing_done: Callable[[Exception], bool],
                         budget_s: float, what: str, on_wait: Callable[[Exception], None] | None = None) -> T:
    """``send()``, asked again while it fails in a way that did nothing on the server (``nothing_done``: a
    busy answer, or a request that never arrived because the service is down or restarting), waiting 2 s
    doubling to 30 s, for at most ``budget_s`` seconds in all (0: raise at once). Other failures raise.
    ``on_wait(exc)`` hears of each failure that is waited on (a fleet sends later work elsewhere)."""
    give_up, wait_s = time.monotonic() + budget_s, 2.0
    while True:
        try:
            return await send()
        except Exception as exc:  # noqa: BLE001 - re-raised unless it provably did nothing
            if not nothing_done(exc) or time.monotonic() + wait_s >= give_up:
                raise
            level = logging.WARNING if never_sent(exc) else logging.INFO
            logger.log(level, "%s: %s; asking again in %.0fs", what, exc, wait_s)
            if on_wait is not None:
                on_wait(exc)
            await asyncio.sleep(wait_s)
            wait_s = min(30.0, wait_s * 2)
