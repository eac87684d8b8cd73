"""``--dry-run``'s probes: every external service the run would use is asked one cheap question before anything
expensive starts, and answers ``probe: <role> <url>: ok`` or what went wrong.

Why: a run first contacts a user's gym and agent service after AReaL loaded and vLLM started (the agent in step 1,
minutes in), so a typo, a firewall, a missing token or a server that does not speak the protocol cost a model load
to find. The dry-run asks instead, all services at once, each within ``TIMEOUT_S`` (``BUDGET_S`` in all):

- each gym host of ``gym_base_url`` (a fleet may list several): ``GET {base}/api/v1/{gym_id}/tasks``, with
  ``CUA_GYM_TOKEN`` as the trainer's client sends it; ok is a JSON list of tasks (``{"tasks": [...]}`` or bare);
- the agent service when ``agent_service=external``: ``GET {base}/runs/<an id nobody has>`` with
  ``CUA_AGENT_TOKEN``; ok is the protocol's answer to an unknown run, a 404 (a route that does not exist answers
  a web server's error page or FastAPI's bare ``{"detail": "Not Found"}``: not an agent service);
- the Training Monitor when ``monitor_base_url`` is set: ``GET {base}/healthz`` (our monitor's), else its
  ``GET {base}/api/trainings`` read.

What is started by the run itself (the embedded gym, agent service and monitor, Ray gyms, ``--agent embedded``)
does not exist yet in a dry-run and is not probed. ``--offline`` skips every probe. Nothing a probe sends changes
anything, and no token is ever printed.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable
from urllib.parse import quote

import httpx

from cua_rl.http.auth import AGENT_TOKEN, GYM_TOKEN, TokenError, bearer, token_from_env
from cua_rl.http.client import async_client
from cua_rl.http.retry import AnswerRefused, error_detail, send_with_retry

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig

TIMEOUT_S = 8.0          # one probe: connect and answer
CONNECT_S = 5.0
BUDGET_S = 30.0          # every probe together (they run at once)
MAX_BYTES = 256 * 1024   # a probe's answer is small; a longer one is not read


class ProbeFailed(Exception):
    """What went wrong, in words for the probe's line."""


@dataclass(frozen=True)
class Probe:
    role: str                                       # gym | agent | monitor
    url: str                                        # what the line shows (the base URL)
    check: Callable[[], Awaitable[None]]            # raises ProbeFailed


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


async def _get(url: str, token_env: str | None) -> httpx.Response:
    """One GET of ``url`` (the token of ``token_env`` as the client sends it), its answer read up to
    ``MAX_BYTES``; a transport failure becomes ``ProbeFailed`` saying which (refused, unresolved, timed out)."""
    try:
        headers = bearer(token_from_env(token_env)) if token_env else {}
    except TokenError as exc:
        raise ProbeFailed(f"{exc} ({token_env}_FILE)") from None
    async with async_client(timeout=httpx.Timeout(TIMEOUT_S, connect=CONNECT_S), headers=headers) as client:
        try:
            return await send_with_retry(client, "GET", url, policy=None, what=f"probe GET {url}", max_bytes=MAX_BYTES)
        except httpx.ConnectTimeout:
            raise ProbeFailed(f"timed out connecting ({CONNECT_S:g} s): a firewall, or no such host there") from None
        except httpx.TimeoutException:
            raise ProbeFailed(f"timed out: connected, no answer within {TIMEOUT_S:g} s") from None
        except httpx.ConnectError as exc:
            raise ProbeFailed(_connect_error(exc)) from None
        except httpx.TransportError as exc:
            raise ProbeFailed(f"{type(exc).__name__}: {_short(str(exc))}") from None
        except AnswerRefused as exc:
            raise ProbeFailed(f"not our protocol: {exc}") from None


def _connect_error(exc: httpx.ConnectError) -> str:
    text, cause = str(exc), exc   # httpx says "All connection attempts failed"; the OSError below it says why
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (nothing listens on that port)"
        if isinstance(cause, OSError) and cause.strerror:
            text = f"{text}: {cause.strerror}"
            break
        cause = cause.__cause__ or cause.__context__
    if "refused" in text.lower():
        return "connection refused (nothing listens on that port)"
    if "name" in text.lower() and ("resolution" in text.lower() or "known" in text.lower()):
        return f"cannot resolve the host name ({_short(text, 80)})"
    return f"cannot connect: {_short(text) or type(exc).__name__}"


def _is_page(text: str) -> bool:
    return text.lstrip()[:15].lower().startswith(("<!doctype", "<html"))


def _status_problem(response: httpx.Response, token_env: str | None, path: str) -> str:
    """The words for an HTTP error status (a 401 says which token is missing or refused)."""
    status = response.status_code
    if status == 401 and token_env:
        sent = "Authorization" in response.request.headers
        return (f"401: the token was refused ({token_env})" if sent
                else f"401: needs a token ({token_env} or {token_env}_FILE)")
    return f"HTTP {status} on GET {path}: {_short(error_detail(response))}"


def _json(response: httpx.Response, what: str) -> object:
    try:
        return response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise ProbeFailed(f"not our protocol: {what} answered {kind}, not JSON "
                          f"({_short(response.text, 60)!r})") from None


async def probe_gym(base: str, gym_id: str) -> None:
    if not gym_id:
        raise ProbeFailed("no gym id to ask for (--gym-id / GYM_ID)")
    path = f"/api/v1/{quote(gym_id, safe='')}/tasks"
    response = await _get(base.rstrip("/") + path, GYM_TOKEN)
    if response.status_code == 404:
        body = _json(response, f"GET {path}")
        raise ProbeFailed(f"HTTP 404 on GET {path}: {_short(str(body))} (the gym id {gym_id!r} is not served "
                          f"there, or not a genv gym)")
    if response.status_code >= 400:
        raise ProbeFailed(_status_problem(response, GYM_TOKEN, path))
    body = _json(response, f"GET {path}")
    tasks = body.get("tasks") if isinstance(body, dict) else body
    if not isinstance(tasks, list):
        raise ProbeFailed(f"not our protocol: GET {path} answered no list of tasks ({_short(str(body), 80)})")


async def probe_agent(base: str) -> None:
    path = f"/runs/cua-probe-{secrets.token_hex(6)}"
    response = await _get(base.rstrip("/") + path, AGENT_TOKEN)
    if response.status_code == 401:
        raise ProbeFailed(_status_problem(response, AGENT_TOKEN, path))
    if response.status_code == 404:   # the protocol's answer, unless it is a web page or a route nobody serves
        if _is_page(response.text):
            raise ProbeFailed(f"not our protocol: GET {path} answered a web page (a 404 of a web server, not an "
                              "agent service's unknown run)")
        try:
            body = response.json()
        except ValueError:   # a plain-text 404 naming the run (the protocol does not fix its body)
            return
        if isinstance(body, dict) and body.get("detail") == "Not Found":
            raise ProbeFailed(f"not our protocol: GET {path} is no route there (FastAPI's bare Not Found); an "
                              "agent service answers an unknown run with a 404 naming it")
        return
    if response.status_code >= 400:
        raise ProbeFailed(_status_problem(response, AGENT_TOKEN, path))
    _json(response, f"GET {path}")   # a service that answers unknown runs with 200 JSON: still the protocol


async def probe_monitor(base: str) -> None:
    base = base.rstrip("/")
    response = await _get(base + "/healthz", None)
    if response.status_code < 400:
        return
    fallback = await _get(base + "/api/trainings", None)
    if fallback.status_code in (401, 403) or fallback.status_code < 400:
        _json(fallback, "GET /api/trainings")
        return
    raise ProbeFailed(f"HTTP {response.status_code} on GET /healthz and HTTP {fallback.status_code} on GET "
                      f"/api/trainings: not a Training Monitor")


def probes_of(config: CUAConfig) -> list[Probe]:
    """The probes of a loaded CUAConfig: only services the run does not start itself."""
    found: list[Probe] = []
    if not config.embedded_enabled:
        for url in config.gym_urls:
            found.append(Probe("gym", url, lambda url=url: probe_gym(url, config.gym_id)))
        if config.agent_service == "external":
            agent = config.gbox_mini_agent_base_url
            found.append(Probe("agent", agent, lambda: probe_agent(agent)))
    if config.monitor_base_url:
        monitor = config.monitor_base_url
        found.append(Probe("monitor", monitor, lambda: probe_monitor(monitor)))
    return found


async def _outcome(probe: Probe) -> str | None:
    """None when the probe passed, else what went wrong."""
    try:
        await asyncio.wait_for(probe.check(), TIMEOUT_S + CONNECT_S)
    except ProbeFailed as exc:
        return str(exc)
    except asyncio.TimeoutError:
        return f"timed out after {TIMEOUT_S + CONNECT_S:g} s"
    return None


async def run_probes(probes: list[Probe]) -> list[str | None]:
    """Every probe at once, within ``BUDGET_S``: one outcome each (None: ok)."""
    tasks = [asyncio.ensure_future(_outcome(p)) for p in probes]
    done, pending = await asyncio.wait(tasks, timeout=BUDGET_S) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    return [t.result() if t in done else f"no answer within the probes' {BUDGET_S:g} s" for t in tasks]


def probe_services(config: CUAConfig, out=print) -> int:
    """Probe the services of ``config`` and print one line each: 0 when all answered as expected, else 1."""
    probes = probes_of(config)
    if not probes:
        return 0
    outcomes = asyncio.run(run_probes(probes))
    for probe, problem in zip(probes, outcomes):
        out(f"probe: {probe.role} {probe.url}: {problem or 'ok'}")
    failed = [p.role for p, problem in zip(probes, outcomes) if problem]
    if failed:
        out(f"probes: {len(failed)} of {len(probes)} failed; fix them, or pass --offline to skip the probes")
    return 1 if failed else 0
