"""Work for an HTTP request that ends when its client hangs up: ``unless_client_leaves``.

Why: uvicorn runs a request's handler to its end whether or not anyone still waits for the answer, and an answer
to a closed connection is dropped without a word. For most requests that costs a little time; for one that makes
something (the gym's create and fork start desktops) it leaves what it made running with ids nobody knows, until
an idle reaper ends it (docs/security.md, "Leave executions running that nobody knows of"). So such a request
watches its connection while its work runs: once the client is gone the work is cancelled (its own clean-up ends
what it made so far), and what it finished anyway is handed to ``undo``. A client that hangs up after the answer
was sent cannot be told from one that read it: that window (the answer's last write) is left.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

from starlette.requests import Request

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ClientGone(Exception):
    """The request's client closed its connection before the answer; its work was cancelled or undone."""


async def _hang_up(request: Request) -> bool:
    """Wait until the request's client closes its connection (True); False when the connection cannot be
    watched (the server's receive failed), so the work runs to its end as it would unwatched. Call after the
    body is read: uvicorn's next message is then ``http.disconnect``, sent when the connection closes."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception as exc:  # noqa: BLE001 - an unwatchable connection only loses the early end
        logger.debug("cannot watch the connection of %s %s: %r", request.method, request.url.path, exc)
        return False
    return True


async def unless_client_leaves(request: Request, work: Awaitable[T],
                               undo: Callable[[T], Awaitable[object]] | None = None) -> T:
    """``work``'s result, unless the client of ``request`` hangs up first: then ``work`` is cancelled (or, when it
    finished anyway, ``undo`` is called with its result) and ``ClientGone`` is raised. ``request``'s body must
    have been read. Cancelling this call cancels ``work`` too."""
    job = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        if await _hang_up(request):
            gone = True
            job.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await job
    except asyncio.CancelledError:
        if gone and not asyncio.current_task().cancelling():   # cancelled for the hang-up, not by our caller
            raise ClientGone(f"the client of {request.method} {request.url.path} hung up before the answer; "
                             f"its work was cancelled") from None
        raise
    finally:
        watcher.cancel()
    if gone:   # the hang-up came as the work finished: the cancel was too late to stop it
        if undo is not None:
            try:
                await undo(result)
            except Exception:  # noqa: BLE001 - nobody waits for the answer; the log says what was left
                logger.exception("undoing %s %s for a client that hung up failed", request.method, request.url.path)
        raise ClientGone(f"the client of {request.method} {request.url.path} hung up before the answer; what it "
                         f"made was undone")
    return result
