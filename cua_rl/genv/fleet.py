"""A fleet of gym hosts: one run over several genv gyms. Where each group of episodes plays, which hosts are
alive, and what happens when one dies.

Why: a GPU node takes episodes faster than one CPU host makes them, so a run names several gyms
(``gym_base_url``: ``URL,URL,...``, a YAML list, or ``@FILE`` with one URL a line; ``parse_gym_urls``). The
rules (docs/cluster.md, "A fleet of gym hosts"):

- Placement: a group (the episodes of one task instance) goes to one host, the one with the most room: the
  free capacity it reports (``GET /api/v1/{gym}/capacity`` answers ``{"free": n, "max": m}``) less the episodes
  this process placed there that have not created their execution yet, or, for a gym without that route, the
  fewest episodes this process has in flight there. An execution stays on its host. A 429 (full) is back-pressure: the host counts as full
  until its next report (``Placement.busy``), so later groups go elsewhere; when no host has room, a group
  waits for one. A capacity report is read defensively: anything but two integers ``0 <= free <= max <=
  MAX_CAPACITY`` (1e999, Infinity, NaN, a negative, a string, a bool, a float, not JSON) makes the host take no
  new group until it reports one, is logged with the host and the value, and counts as a failed check.
- Health: every ``interval_s`` each host is asked ``GET {base}/health`` within ``timeout_s`` (any answer below
  500 is alive: a gym without that route answers 404). Two failed checks in a row drain a host, and so does a
  failed re-check after an episode saw it fail (``suspect``: the workflow asks when an episode was dropped as
  the gym's). Draining marks every placement on the host lost (``Placement.lost``): the workflow drops those
  groups, never trains them, and plays their task items again on another host. A drained host is still
  asked and rejoins when it answers; a host that is down when the run starts takes work once it is up.
  A check that raises (whatever a host answered) is a failed check of that host, never the end of the watch.
- Creates: a host whose creates fail ``CREATE_FAILS_TO_DRAIN`` times in a row (an error, or a 429 while its
  last report said it had room, counted once per such report: a host that others filled says so in its next
  one) with no create succeeding there in between is drained too, though its
  ``/health`` answers (episodes use ``Placement.execution``, which tells the fleet). It rejoins after a
  cool-down (``cool_down_s``, 30 s, doubled for each such drain in a row, at most ``MAX_COOL_DOWN_S``) once its
  health and capacity checks pass; a create that succeeds there ends the doubling.
- One gym is no fleet (``fleet_of`` returns None): the workflow plays on it as it always did, and a failure
  there is a lost episode.

A ``Fleet`` belongs to one event loop (its watch is a task of that loop, its events are that loop's);
``fleet_of`` keeps one per loop and URL list. ``DRAINS`` counts the drains of each host in this process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import re
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx

from ..http.auth import GYM_TOKEN, bearer, token_from_env
from ..http.client import async_client
from ..http.input import parse_json
from ..http.retry import AnswerRefused, send_with_retry
from .errors import GenvError

logger = logging.getLogger(__name__)

INTERVAL_S = 2.0          # between two health checks of a host
TIMEOUT_S = 3.0           # one health check (connect and answer)
FAILS_TO_DRAIN = 2        # failed checks in a row that drain a host
BUSY_HOLD_S = 5.0         # a host that answered 429 and reports no capacity is passed over this long
IDLE_S = 60.0             # the watch ends after this long with nothing placed (the next placement restarts it)
MAX_RERUNS = 3            # times one group's task item is played again after its host drained
MAX_CAPACITY = 100_000    # the most executions a capacity report may name (more is not a report)
CREATE_FAILS_TO_DRAIN = 3  # failed creates in a row (errors, or 429s while reporting room) that drain a host
COOL_DOWN_S = 30.0        # a host drained for its creates is not asked back before this (doubled each time)
MAX_COOL_DOWN_S = 600.0
PROBE_MAX_BYTES = 64 * 1024   # a /health or /capacity answer longer than this is a failed check

DRAINS: collections.Counter[str] = collections.Counter()   # host URL -> drains seen in this process


# ---- the URL list ------------------------------------------------------------------------------------------
def parse_gym_urls(value) -> list[str]:
    """The gym URLs of ``value``: one URL, ``URL,URL,...`` (commas or spaces), ``@FILE`` (one URL a line; blank
    lines and ``#`` comments skipped) or a list of them. Each must be ``http(s)://host[:port][/path]``; a
    trailing ``/`` is dropped; a URL named twice is refused. ``ValueError`` says which and why."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        text = str(value).strip()
        if text.startswith("@"):
            items = _url_file(text)
        else:
            items = re.split(r"[,\s]+", text)
    urls: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        url = item.rstrip("/")
        try:
            parts = urlsplit(url)
            parts.port   # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"gym URL {item!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"gym URL {item!r}: expected http(s)://host[:port] (several: URL,URL,... or @FILE)")
        if url in urls:
            raise ValueError(f"gym URL {url} is named twice")
        urls.append(url)
    return urls


def _url_file(text: str) -> list[str]:
    path = Path(text[1:]).expanduser()
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"gym URLs {text!r}: cannot read the file ({exc.strerror or exc})") from None
    items = [line.split("#", 1)[0].strip() for line in lines]
    if not any(items):
        raise ValueError(f"gym URLs {text!r}: the file names no URL (one a line)")
    return items


def join_gym_urls(urls) -> str:
    """The one way a URL list is written in a config value or a task row: ``URL,URL,...``."""
    return ",".join(urls)


@functools.lru_cache(maxsize=256)
def gym_urls(spec: str) -> tuple[str, ...]:
    """``parse_gym_urls`` of a canonical spec (a config value or a task row), cached: asked once per group."""
    return tuple(parse_gym_urls(spec))


# ---- one host -------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Host:
    url: str
    up: bool | None = None           # None: not asked yet
    was_up: bool = False             # it answered once (a drained host comes back; a late one comes up)
    free: int | None = None          # its last capacity report; None: the gym has no capacity route
    max: int | None = None
    pending: int = 0                 # episodes this process placed here that have not created their execution
    in_flight: int = 0               # episodes this process placed here and has not released
    full_until: float = 0.0          # answered 429: passed over until then (or its next report)
    fails: int = 0                   # failed checks in a row
    odd: str = ""                    # what was wrong with its last capacity report ("": nothing); no work then
    create_fails: int = 0            # failed creates in a row (CREATE_FAILS_TO_DRAIN drain it)
    create_drains: int = 0           # drains for failed creates in a row (each doubles the cool-down)
    checked_at: float = 0.0          # its last passed check (health and capacity)
    refused_at: float = 0.0          # its last 429 counted as a failed create
    cool_until: float = 0.0          # drained for its creates: not back before then
    down_since: float | None = None
    why_down: str = ""
    placements: set = field(default_factory=set)

    def room(self, now: float) -> int:
        """How many more episodes it takes: its reported free capacity less the placed episodes not created yet,
        or (no capacity route) minus its in-flight episodes, which ranks it by them."""
        if self.max is None:
            return -self.in_flight
        return 0 if self.full_until > now else self.free - self.pending

    def fits(self, n: int, now: float) -> bool:
        if self.odd:
            return False
        if self.max is None:
            return self.full_until <= now
        return self.room(now) >= min(n, max(self.max, 1))


@dataclass(eq=False)
class Placement:
    """``n`` episodes of one group placed on ``host``; ``lost`` is set when the host drains while it is held.
    Each episode says ``created`` once its execution exists (or ``busy`` on a 429); ``release`` when the group
    is done (or given up)."""

    fleet: "Fleet"
    host: Host
    n: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    released: bool = False
    pending: int = 0

    @property
    def url(self) -> str:
        return self.host.url

    def busy(self, _error=None) -> None:
        """The host answered 429 (full) to one of this group's creates: the next groups go elsewhere."""
        self.fleet.busy(self.host)

    def created(self) -> None:
        """One of this group's executions exists: the host's own report counts it from now on, and its creates
        work."""
        self.fleet.create_worked(self.host)
        if self.pending > 0:
            self.pending -= 1
            self.host.pending -= 1

    def create_failed(self, error: GenvError) -> None:
        """One of this group's creates failed (after the client's own waiting): counted against the host."""
        self.fleet.create_failed(self.host, f"create failed: {error}")

    @contextlib.asynccontextmanager
    async def execution(self, gym, task_id: str, options: dict | None = None, *, busy_wait_s: float = 0.0):
        """``gym.execution(...)`` (a ``GenvClient`` on this placement's host) that tells the fleet how its
        create went: each 429 (``busy``), the execution made (``created``) or the create failed
        (``create_failed``). The execution is terminated on the way out, as ``gym.execution`` does."""
        made = False
        try:
            async with gym.execution(task_id, options, busy_wait_s=busy_wait_s, on_busy=self.busy) as execution:
                made = True
                self.created()
                yield execution
        except GenvError as exc:
            if not made:   # a last 429 (the client's waiting spent) counts as the others did
                self.busy(exc) if exc.status_code == 429 else self.create_failed(exc)
            raise

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.host.in_flight -= self.n
        self.host.pending -= self.pending
        self.pending = 0
        self.host.placements.discard(self)
        self.fleet.notify()


# ---- the fleet ------------------------------------------------------------------------------------------
class Fleet:
    """The hosts of one URL list for one event loop (see the module docstring)."""

    def __init__(self, urls, gym_id: str, *, interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S,
                 cool_down_s: float = COOL_DOWN_S, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not urls:
            raise ValueError("a fleet needs at least one gym URL")
        self.hosts = [Host(u) for u in urls]
        self.gym_id = gym_id
        self.interval_s, self.timeout_s, self.cool_down_s = interval_s, timeout_s, cool_down_s
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._watch: asyncio.Task | None = None
        self._changed = asyncio.Event()
        self._asked = asyncio.Event()       # every host asked once
        self._last_placed = time.monotonic()
        self._waiting_said = False

    @property
    def urls(self) -> list[str]:
        return [h.url for h in self.hosts]

    def host(self, url: str) -> Host:
        return next(h for h in self.hosts if h.url == url)

    # -- placement ----------------------------------------------------------------------------------------
    async def place(self, n: int) -> Placement:
        """A host for a group of ``n`` episodes (see the module docstring); waits while no host has room."""
        self._start_watch()
        await self._asked.wait()
        while True:
            host = self._choose(n)
            if host is not None:
                self._waiting_said = False
                return self._reserve(host, n)
            if not self._waiting_said:
                self._waiting_said = True
                logger.info("no gym host has room for a group of %d (%s): waiting", n, self.describe())
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.interval_s)
            self._start_watch()

    def _choose(self, n: int) -> Host | None:
        now = time.monotonic()
        ready = [h for h in self.hosts if h.up and h.fits(n, now)]
        if not ready:
            return None
        return max(ready, key=lambda h: (h.room(now), -h.in_flight, -self.hosts.index(h)))

    def _reserve(self, host: Host, n: int) -> Placement:
        placement = Placement(self, host, n, pending=n)
        host.in_flight += n
        host.pending += n
        host.placements.add(placement)
        self._last_placed = time.monotonic()
        return placement

    def busy(self, host: Host) -> None:
        """``host`` answered 429 to a create: passed over until its next report; a refusal while its last report
        said it had room counts as a failed create (a host that always does is drained)."""
        now = time.monotonic()
        host.full_until = now + BUSY_HOLD_S
        logger.info("gym host %s answered 429 (full): the next groups go to other hosts", host.url)
        # counted once per check that said it had room again: a host that owns up to being full in its next
        # report (one that others' episodes filled) is never counted twice for one report
        if (host.max is None or (host.free or 0) > 0) and host.checked_at > host.refused_at:
            host.refused_at = now
            self.create_failed(host, f"answered 429 while reporting {host.free} free" if host.max is not None
                               else "answered 429")

    def create_worked(self, host: Host) -> None:
        host.create_fails = host.create_drains = 0

    def create_failed(self, host: Host, why: str) -> None:
        """A create on ``host`` failed: ``CREATE_FAILS_TO_DRAIN`` in a row drain it for a cool-down."""
        host.create_fails += 1
        if host.create_fails < CREATE_FAILS_TO_DRAIN or not host.up:
            return
        cool_s = min(MAX_COOL_DOWN_S, self.cool_down_s * 2 ** host.create_drains)
        host.create_drains += 1
        host.create_fails = 0
        host.cool_until = time.monotonic() + cool_s
        self._drain(host, f"{CREATE_FAILS_TO_DRAIN} creates in a row failed, the last: {why}; "
                          f"not asked back for {cool_s:g} s")

    def notify(self) -> None:
        self._changed.set()

    def describe(self) -> str:
        now = time.monotonic()
        return ", ".join(f"{h.url} " + ("down" if not h.up else f"{h.in_flight} in flight" +
                                        (f", {h.room(now)} free" if h.max is not None else ""))
                         for h in self.hosts)

    # -- health -------------------------------------------------------------------------------------------
    async def suspect(self, host: Host) -> bool:
        """An episode saw ``host`` fail: ask it again now (twice, a second apart); True when it is drained."""
        if not host.up:
            return True
        for attempt in range(2):
            alive, why = await self._alive(host)
            if alive:
                return False
            if attempt == 0:
                await asyncio.sleep(1.0)
        self._drain(host, why)
        return True

    async def refresh(self) -> None:
        """Ask every host now (health, then capacity), as the watch does every ``interval_s``. Never raises for
        what a host answered: a check that raises is that host's failed check."""
        try:
            await asyncio.gather(*(self._check_safely(h) for h in self.hosts))
        finally:
            self._asked.set()
            self.notify()

    async def _check_safely(self, host: Host) -> None:
        try:
            await self._check(host)
        except Exception as exc:  # noqa: BLE001 - one odd host must never end the watch of all of them
            logger.warning("gym host %s: its check raised %s: %s (counted as a failed check)", host.url,
                           type(exc).__name__, exc, exc_info=host.fails == 0)
            self._failed_check(host, f"its check raised {type(exc).__name__}: {exc}")

    def _start_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._run_watch(), name="gym-fleet-watch")

    async def _run_watch(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - refresh catches each host's; this is the last guard of the loop
                logger.exception("gym fleet watch: a refresh failed; asking again in %.1f s", self.interval_s)
            if self._idle():
                return
            await asyncio.sleep(self.interval_s)

    def _idle(self) -> bool:
        return (all(h.up for h in self.hosts) and not any(h.in_flight for h in self.hosts)
                and time.monotonic() - self._last_placed > IDLE_S)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = async_client(timeout=httpx.Timeout(self.timeout_s), transport=self._transport,
                                        headers=bearer(token_from_env(GYM_TOKEN)))   # /capacity needs the token
        return self._client

    async def _get(self, url: str) -> httpx.Response:
        """One probe, its answer read up to ``PROBE_MAX_BYTES`` and never decompressed (``AnswerRefused``)."""
        return await asyncio.wait_for(
            send_with_retry(self._http(), "GET", url, policy=None, what=f"gym fleet probe {url}",
                            max_bytes=PROBE_MAX_BYTES), self.timeout_s + 1)

    async def _alive(self, host: Host) -> tuple[bool, str]:
        try:
            response = await self._get(f"{host.url}/health")
        except (httpx.HTTPError, TimeoutError, OSError, AnswerRefused) as exc:
            return False, f"{type(exc).__name__}: {exc}".rstrip(": ")
        if response.status_code >= 500:
            return False, f"HTTP {response.status_code} from /health"
        return True, ""

    async def _check(self, host: Host) -> None:
        alive, why = await self._alive(host)
        if alive:
            why = await self._capacity(host)
        if why:
            self._failed_check(host, why)
            return
        host.fails, host.checked_at = 0, time.monotonic()
        if host.up is not True:
            if time.monotonic() < host.cool_until:
                return   # drained for its creates: its cool-down is not over
            if host.up is False:
                logger.warning("gym host %s is %s (down %.0f s): it takes work%s", host.url,
                               "back" if host.was_up else "up", time.monotonic() - (host.down_since or time.monotonic()),
                               " again" if host.was_up else "")
            host.up, host.was_up, host.down_since, host.why_down = True, True, None, ""

    def _failed_check(self, host: Host, why: str) -> None:
        host.fails += 1
        if host.up is None:
            host.up, host.down_since, host.why_down = False, time.monotonic(), why
            logger.warning("gym host %s is not up (%s): it takes work once it answers", host.url, why)
        elif host.up and host.fails >= FAILS_TO_DRAIN:
            self._drain(host, why)

    async def _capacity(self, host: Host) -> str:
        """Reads ``host``'s capacity report: "" when it is one (or the gym has no such route), else what is wrong
        with it (the host then takes no new group: ``Host.odd``)."""
        url = f"{host.url}/api/v1/{quote(self.gym_id, safe='')}/capacity"
        try:
            response = await self._get(url)
        except (httpx.HTTPError, TimeoutError, OSError):
            return ""   # the health check decides about the host; the last report stands
        except AnswerRefused as exc:
            return self._odd(host, f"its capacity answer was refused: {exc}")
        if response.status_code in (404, 405):
            host.free = host.max = None   # a gym without the route: placed by its in-flight episodes
            host.odd = ""
            return ""
        report = _capacity_report(response)
        if isinstance(report, str):
            return self._odd(host, report)
        host.free, host.max = report
        host.full_until, host.odd = 0.0, ""
        return ""

    def _odd(self, host: Host, why: str) -> str:
        if host.odd != why:
            logger.warning("gym host %s: %s; it takes no new group until it reports its capacity (%d such "
                           "checks in a row drain it)", host.url, why, FAILS_TO_DRAIN)
        host.odd = why
        return why

    def _drain(self, host: Host, why: str) -> None:
        host.up, host.down_since, host.why_down = False, time.monotonic(), why
        DRAINS[host.url] += 1
        lost = list(host.placements)
        for placement in lost:
            placement.lost.set()
        logger.warning("gym host %s drained (%s): %d group(s) in flight there are dropped, never trained, and "
                       "played again on other hosts; it rejoins when it answers again", host.url, why, len(lost))
        self.notify()

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _capacity_report(response: httpx.Response) -> tuple[int, int] | str:
    """(free, max) of a capacity answer, or what is wrong with it, the value quoted: only JSON integers (not
    bools, not floats, whatever they hold) with ``0 <= free <= max <= MAX_CAPACITY`` are a report."""
    said = f"capacity answer HTTP {response.status_code} {response.text[:200]!r}"
    if response.status_code != 200:
        return f"{said} is not a report"
    try:
        body = parse_json(response.content)
    except ValueError:
        return f"{said} is not JSON"
    if not isinstance(body, dict):
        return f"{said} is not an object"
    free, most = body.get("free"), body.get("max")
    if not all(type(v) is int for v in (free, most)) or not 0 <= free <= most <= MAX_CAPACITY:
        return f"{said} is not two integers 0 <= free <= max <= {MAX_CAPACITY}"
    return free, most


_FLEETS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


def fleet_of(urls, gym_id: str, **options) -> Fleet | None:
    """This event loop's fleet of ``urls`` (made on first use), or None for a single gym (no fleet)."""
    urls = tuple(urls)
    if len(urls) < 2:
        return None
    fleets = _FLEETS.setdefault(asyncio.get_running_loop(), {})
    key = (urls, gym_id)
    if key not in fleets:
        fleets[key] = Fleet(urls, gym_id, **options)
    return fleets[key]


async def first_answering(urls, probe):
    """``await probe(url)`` for each URL in turn until one answers without an exception; the last exception
    when none does (the task list of a fleet: every host serves the same tasks)."""
    last: Exception | None = None
    for url in urls:
        try:
            return await probe(url)
        except Exception as exc:  # noqa: BLE001 - the next host is asked; the last error is raised
            last = exc
            logger.warning("gym host %s did not answer (%s); asking the next one", url, exc)
    raise last if last is not None else ValueError("no gym URL")
