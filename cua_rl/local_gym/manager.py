"""Executions and the warm pool: who owns which desktop, the concurrency cap, the TTL reaper.

Why a pool per desktop profile: a desktop (display + WM + the task's apps on the task's files) takes
~0.4-0.8 s to build, so spares for recently used profiles are built in the background and
create-execution just hands one out. A profile is the spec's ``pool_key`` (the full ``DesktopSpec`` for app
desktops, so tasks with equal setups share spares; a browser's size and zoom for browser desktops, whose
spares are built showing the most recently asked-for page and load another one when handed out for it).
An app desktop serves one execution. A browser desktop serves up to ``reuse_browsers`` N executions (MiniWoB++:
50 by default, ``SUITE_REUSE``; 0 = a new browser for each), and between them nothing of one episode is left for
the next (``BrowserDesktop.recycle``: storage, clipboard, selections, modifiers; the profile keeps no form
history): a browser start costs about 1.4 s of CPU per episode. With ``restart_in_page`` (MiniWoB++'s default) the
next episode restarts in the used page, as the MiniWoB++ package's own environment does, instead of a reload
(about 90 ms of Chromium CPU per episode more; docs/local_gym.md, "Browsers are reused").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import functools
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import mounts, procs
from .desktop import Desktop, DesktopSpec, SandboxLimits
from .live import LiveView, LiveViewError
from .metrics import GymMetrics
from .tasks import TaskDef
from .vm.backend import forget_templates

logger = logging.getLogger(__name__)


SUITES = ("desktop", "miniwob")
# Per suite: screen size and warm spares per profile. MiniWoB++'s 160x210 task area fills 480x630 at 3x;
# all its tasks share one browser profile, so its pool holds more spares.
SUITE_DEFAULTS = {"desktop": (1280, 800, 1), "miniwob": (480, 630, 4)}
# Per suite: executions one browser desktop serves (GymOptions.reuse_browsers) and whether the next one restarts in
# the used page (GymOptions.restart_in_page). A browser start costs ~1.4 s of CPU, a reload ~90 ms more than a
# restart in the page; tests/local_gym/test_miniwob.py shows a reused browser's next episode equal to a new
# browser's (test_nothing_of_an_episode_survives_into_the_next_in_the_same_browser).
SUITE_REUSE = {"desktop": 0, "miniwob": 50}
SUITE_RESTART_IN_PAGE = {"desktop": False, "miniwob": True}


@dataclass
class GymOptions:
    gym_id: str = "desktop"
    suite: str = ""                # "desktop" | "miniwob"; "" = "miniwob" when gym_id is "miniwob", else "desktop"
    width: int | None = None       # None = the suite's default
    height: int | None = None
    max_executions: int = 16       # running executions; more -> 429
    pool_size: int | None = None   # spares kept per recently used profile; None = the suite's default
    max_spares: int = 4            # spares over all profiles
    x_spares: int = 2              # bare X servers kept started for cold creates (any profile of the gym's size)
    prewarm: list[str] = field(default_factory=list)   # task ids whose profiles are warmed at start
    ttl_s: float = 1800.0          # an execution idle this long is terminated by the reaper
    reap_interval_s: float = 5.0
    display_base: int = 300        # displays :300, :301, ... (skipping ones in use)
    uid_base: int = 20000          # sandbox uid = uid_base + slot (only when the server runs as root)
    workdir: str | None = None
    tasks_dir: str | None = None
    # tasks written inline (a task file's schema, e.g. a training config's custom task source), served beside
    # the built-in ones (or tasks_dir's)
    extra_tasks: list = field(default_factory=list)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    start_timeout_s: float = 30.0
    miniwob_time_limit_s: float = 3600.0   # replaces each MiniWoB++ page's own 7-30 s episode timer
    reuse_browsers: int | None = None   # executions one browser desktop serves; 0 or 1: a new browser each;
    #                                     None = the suite's default (SUITE_REUSE: miniwob 50)
    restart_in_page: bool | None = None  # with reuse_browsers 2 or more: the next episode restarts in the used
    #                                     page instead of a reload (the MiniWoB++ package's way); None = the
    #                                     suite's default (SUITE_RESTART_IN_PAGE: miniwob on), off without reuse
    live_view_host: str = "127.0.0.1"   # where live views (live.py) listen; they have no password
    evaluate_timeout_s: float = 60.0    # an evaluate that takes longer fails (503); its execution's next ones wait
    # The learning bench's gym-fault mutation only (never for real use): this share of actions fails as the gym's
    # fault (``fault: "gym"``, nothing played), drawn per execution from its id, so a run shows what training
    # gym faults as the policy's failures does (bench/learning_bench.py MUTATIONS)
    fault_rate: float = 0.0
    fork_wait_s: float = 5.0            # how long a fork's child may take to show the parent's screen before each
    #                                     replayed action, at the end, and to have its task state (fork.py); then 409

    def __post_init__(self) -> None:
        if not self.suite:
            self.suite = "miniwob" if self.gym_id == "miniwob" else "desktop"
        if self.suite not in SUITES:
            raise ValueError(f"suite must be one of {SUITES}, got {self.suite!r}")
        if not 0 <= self.fault_rate < 1:
            raise ValueError(f"fault_rate must be in [0, 1), got {self.fault_rate}")
        if not 0 < self.evaluate_timeout_s <= 3600:
            raise ValueError(f"evaluate_timeout_s must be in (0, 3600] seconds, got {self.evaluate_timeout_s}")
        if self.reuse_browsers is None:
            self.reuse_browsers = SUITE_REUSE[self.suite]
        if not 0 < self.fork_wait_s <= 600:
            raise ValueError(f"fork_wait_s must be within (0, 600] s, got {self.fork_wait_s}")
        if self.reuse_browsers < 0:
            raise ValueError(f"reuse_browsers must be 0 (never) or more, got {self.reuse_browsers}")
        if self.restart_in_page is None:
            self.restart_in_page = SUITE_RESTART_IN_PAGE[self.suite] and self.reuse_browsers >= 2
        if self.restart_in_page and self.reuse_browsers < 2:
            raise ValueError("restart_in_page restarts episodes in a reused browser: it needs reuse_browsers 2 or "
                             f"more, got {self.reuse_browsers}")
        width, height, pool = SUITE_DEFAULTS[self.suite]
        self.width = width if self.width is None else self.width
        self.height = height if self.height is None else self.height
        self.pool_size = pool if self.pool_size is None else self.pool_size


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _x_listening(n: int) -> bool:
    """Whether an X server accepts connections on display ``n`` (abstract or path socket)."""
    for address in (f"\0/tmp/.X11-unix/X{n}", f"/tmp/.X11-unix/X{n}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            try:
                sock.connect(address)
                return True
            except OSError:
                continue
    return False


# One lock file per display number, held (flock) by the gym process whose desktop uses it: two gyms on one machine
# (several gym servers, a launcher's and a test's, the fleet's hosts in one box) otherwise both saw a number free
# and started Xvfb on it at once, and one desktop failed to start. The kernel drops a dead process's lock.
DISPLAY_CLAIMS = Path(tempfile.gettempdir()) / "cua-rl-displays"


# The same for the sandbox uids (root gyms only). Two gyms on one machine gave their desktops the same uids
# (``uid_base`` + slot), and desktops failed to start while both ran: openbox set its check window, then took no
# map request for 30 s (5 of 5 reproductions beside another gym; with distinct uids 60 of 60 started; why is not
# known: docs/notes/ci-ledger.md, "Flakes", session 37). A gym claims a uid for each slot it uses until it closes.
UID_CLAIMS = Path(tempfile.gettempdir()) / "cua-rl-uids"
UID_RANGE = 10_000       # uids tried from ``uid_base``
DISPLAY_RANGE = 10_000   # display numbers tried from ``display_base``


def _claim_first(folder: Path, first: int, count: int, held, free=lambda n: True) -> tuple[int, int] | None:
    """The first number from ``first`` (``count`` tried) that is not in ``held`` (this gym's), that this machine's
    other gyms have not claimed in ``folder`` (``_claim``) and that ``free`` accepts: (the number, the descriptor
    holding its claim), or None when every one is taken."""
    for n in range(first, first + count):
        if n in held:
            continue
        claim = _claim(folder, n)
        if claim is None:
            continue
        if free(n):
            return n, claim
        os.close(claim)
    return None


def _claim(folder: Path, n: int) -> int | None:
    """An open descriptor holding this machine's claim on number ``n`` of ``folder`` among our gyms (an flock on
    ``folder/n.lock``), or None when another gym holds it (or its lock file is not ours to open)."""
    try:
        folder.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(folder / f"{n}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _display_free(n: int) -> bool:
    """True when display ``n`` is unused; clears the lock and socket a killed X server left behind.

    Xvfb started with -displayfd keeps no lock file, so "in use" is decided by connecting, never by
    which files exist: a socket nobody answers on is stale (its server was SIGKILLed)."""
    if _x_listening(n):
        return False
    lock, sock = f"/tmp/.X{n}-lock", f"/tmp/.X11-unix/X{n}"
    if os.path.exists(lock):
        try:
            pid = int(open(lock).read().strip() or 0)
        except (OSError, ValueError):
            return False
        if pid and _pid_alive(pid):
            return False
        try:
            os.unlink(lock)
        except OSError:
            return False
    if os.path.exists(sock):
        try:
            os.unlink(sock)
        except OSError:
            return False
    return True


def _remove_stale_workdirs(parent: str) -> None:
    """Delete work folders of gym servers that died without cleaning up (their pid file names a dead pid), and
    empty ones an earlier removal left (a mount still attached then) once they are a minute old (younger, one
    may be a starting gym's, its pid file not yet written)."""
    for path in Path(parent).glob("cua-gym-*"):
        try:
            pid = int((path / "server.pid").read_text())
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > 60:
                    path.rmdir()   # only when empty
            continue
        if not _pid_alive(pid):
            mounts.detach_under(path)   # its HOME mounts, when they live in this namespace (see mounts)
            shutil.rmtree(path, ignore_errors=True)


class CapacityError(RuntimeError):
    pass


@dataclass
class Reservation:
    """Room for executions not yet registered (``GymManager.reserve``); ``left``: how many it still holds."""

    left: int


def pool_key(spec: DesktopSpec):
    """Which spares can serve ``spec``: its ``pool_key`` when it has one, else the spec itself."""
    return getattr(spec, "pool_key", spec)


@dataclass
class Execution:
    execution_id: str
    task: TaskDef
    desktop: Desktop
    created: float
    last_used: float
    from_pool: bool
    reused: bool = False           # the desktop served an execution before (GymOptions.reuse_browsers)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: dict = field(default_factory=dict)
    live: LiveView | None = None   # started on first request (LocalGym.live_view), ended with the execution
    # evaluates run one at a time (LocalGym.evaluate); ``evaluation`` is the last one, which may outlive its
    # request's time limit (then no other evaluate of this execution starts until it ends)
    evaluating: asyncio.Lock = field(default_factory=asyncio.Lock)
    evaluation: asyncio.Future | None = None
    # Calls of this execution that failed, by whose failure it was (LocalGym.act/screenshot): "gym" (its desktop
    # or input failed) and "policy" (an action refused as malformed); "gym_unrecovered": the gym's since the
    # last screenshot or action it served (0 once the agent's next call succeeded: the fault was recovered from).
    # Reported by describe and evaluate (docs/protocols.md 1.4).
    faults: dict = field(default_factory=lambda: {"gym": 0, "policy": 0, "gym_unrecovered": 0})
    # What a fork needs (fork.py): the seed the task began with and its create reply's extra fields, the screen
    # regions the task declares volatile (pixels), the actions played so far with the screen each was played
    # on, why they can no longer be replayed (an action the display refused midway), and the execution this
    # one was forked from.
    seed: int | None = None
    begun: dict = field(default_factory=dict)
    mask: list = field(default_factory=list)
    history: list = field(default_factory=list)
    unreplayable: str | None = None
    forked_from: str | None = None


class GymManager:
    def __init__(self, options: GymOptions) -> None:
        self.opt = options
        self.executions: dict[str, Execution] = {}
        self._reserved = 0                       # creates in flight (count against the cap)
        self._terminating = 0                    # terminations in progress (metrics)
        self.metrics = GymMetrics()              # GET /metrics (metrics.py)
        # All keyed by pool_key(spec); _recent maps a key to the spec its next spares are built with.
        self._spares: dict[object, collections.deque[Desktop]] = collections.defaultdict(collections.deque)
        self._building: collections.Counter[object] = collections.Counter()
        self._recent: collections.OrderedDict[object, DesktopSpec] = collections.OrderedDict()
        self._slot_count = options.max_executions + options.max_spares + options.x_spares + 8
        self._free_slots = list(range(self._slot_count))
        self._bare_x: collections.deque[Desktop] = collections.deque()   # from Desktop.start_x
        self._building_x = 0
        self._display_claims: dict[int, int] = {}        # display in use -> the descriptor holding its claim
        self._slot_uids: dict[int, tuple[int, int]] = {}   # slot -> (its sandbox uid, the descriptor holding its
                                                           # claim until close: UID_CLAIMS)
        self._display_lock = threading.Lock()
        self._create_spawner = procs.Spawner(workers=4)
        self._pool_spawner = procs.Spawner(workers=1)
        self._tasks: set[asyncio.Task] = set()
        self._closing = asyncio.Event()          # set by drain()/close(): new work refused, creates waiting on a build give up
        parent = options.workdir or tempfile.gettempdir()
        _remove_stale_workdirs(parent)
        self.workdir = Path(tempfile.mkdtemp(prefix="cua-gym-", dir=parent))
        os.chmod(self.workdir, 0o711)  # sandbox uids must traverse it to their own 0700 dirs
        (self.workdir / "server.pid").write_text(str(os.getpid()))
        self._ensure_x11_dir()

    @staticmethod
    def _ensure_x11_dir() -> None:
        path = "/tmp/.X11-unix"
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)

    # -- desktops -----------------------------------------------------------------------------------
    def _pick_display(self) -> int:
        with self._display_lock:
            return self._pick_display_locked()

    def _pick_display_locked(self) -> int:
        """The first display from ``display_base`` that no desktop of ours uses, no other gym on this machine
        has claimed (``DISPLAY_CLAIMS``) and no X server answers on; claimed until ``_release_display``."""
        found = _claim_first(DISPLAY_CLAIMS, self.opt.display_base, DISPLAY_RANGE, self._display_claims,
                             free=_display_free)
        if found is None:
            raise RuntimeError(f"no X display free from :{self.opt.display_base} to "
                               f":{self.opt.display_base + DISPLAY_RANGE - 1}")
        n, self._display_claims[n] = found
        return n

    def _release_display(self, n: int) -> None:
        claim = self._display_claims.pop(n, None)
        if claim is not None:
            os.close(claim)

    def _uid(self, slot: int) -> int:
        """The sandbox uid of a slot: its own when the gym is root (the first from ``uid_base`` that no other slot
        of ours has and no other gym on this machine claimed: ``UID_CLAIMS``), else the gym's."""
        if os.geteuid() != 0:
            return os.getuid()
        with self._display_lock:
            if slot not in self._slot_uids:
                found = _claim_first(UID_CLAIMS, self.opt.uid_base, UID_RANGE,
                                     {uid for uid, _ in self._slot_uids.values()})
                if found is None:
                    raise RuntimeError(f"no sandbox uid free from {self.opt.uid_base} to "
                                       f"{self.opt.uid_base + UID_RANGE - 1}: other gyms on this machine hold them")
                self._slot_uids[slot] = found
            return self._slot_uids[slot][0]

    def _take_x(self, spec: DesktopSpec) -> Desktop | None:
        """A started bare X server of ``spec``'s size (its slot comes with it), or None."""
        with self._display_lock:
            for x in self._bare_x:
                if (x.spec.width, x.spec.height) == (spec.width, spec.height):
                    self._bare_x.remove(x)
                    return x
        return None

    def _build(self, spec: DesktopSpec) -> Desktop:
        """Blocking; runs on a spawner thread. Three attempts: an X desktop retries on another display (its
        number may be taken by someone else), a VM on a new machine (one may die while it starts).

        The first attempt builds on a pre-started X server when one is ready (``refill_x``)."""
        cls = spec.desktop_class   # an app, browser or VM desktop
        x = self._take_x(spec) if cls.uses_x else None
        slot = x.slot if x is not None else self._take_slot()  # type: ignore[attr-defined]
        uid = self._uid(slot)
        last: Exception | None = None
        try:
            for attempt in range(1, 4):
                num = x.display_num if x is not None else self._pick_display() if cls.uses_x else -1
                try:
                    desk = cls.start(spec, display_num=num, uid=uid, workdir=self.workdir,
                                     limits=self.opt.limits, timeout_s=self.opt.start_timeout_s, x=x)
                    desk.slot = slot  # type: ignore[attr-defined]
                    return desk
                except Exception as exc:  # noqa: BLE001 - retried on another display, then re-raised
                    # Keep ``num`` marked used: another server may hold it (e.g. only its abstract socket).
                    last = exc
                    # a spare whose build the shutdown interrupted is not news, nor a retried attempt (in
                    # launcher.log); the last attempt's failure is a warning
                    logger.log(logging.INFO if self.closed or attempt < 3 else logging.WARNING,
                               "%s failed (attempt %d/3%s): %s", f"desktop on :{num}" if cls.uses_x else "VM",
                               attempt, ", trying again" if attempt < 3 and not self.closed else "", exc)
                    if x is not None:   # its X server went with the failed desktop
                        self._release_display(num)
                        x = None
                    if self.closed:
                        break
        except BaseException:
            self._free_slots.append(slot)
            raise
        self._free_slots.append(slot)
        raise RuntimeError(f"could not start a desktop: {last}")

    def _take_slot(self) -> int:
        """A free desktop slot (its uid, its place among the gym's desktops); RuntimeError when none is left."""
        with self._display_lock:
            if not self._free_slots:
                raise RuntimeError(f"no desktop slot free: all {self._slot_count} are held by executions, spares "
                                   "and desktops being stopped")
            return self._free_slots.pop(0)

    def _build_x(self) -> Desktop:
        """Blocking, on the pool's spawner thread: one bare X server of the gym's screen size."""
        slot = self._take_slot()
        try:
            num = self._pick_display()
            try:
                x = Desktop.start_x(width=self.opt.width, height=self.opt.height, display_num=num,
                                    uid=self._uid(slot),
                                    workdir=self.workdir, timeout_s=self.opt.start_timeout_s)
            except BaseException:
                self._release_display(num)
                raise
        except BaseException:
            self._free_slots.append(slot)
            raise
        x.slot = slot  # type: ignore[attr-defined]
        return x

    def refill_x(self) -> None:
        """Start bare X servers up to ``x_spares`` in the background (at start, and after a cold create)."""
        if self.closed:
            return
        while len(self._bare_x) + self._building_x < self.opt.x_spares:
            self._building_x += 1
            self._spawn_bg(self._build_bare_x())

    async def _build_bare_x(self) -> None:
        try:
            x = await asyncio.wrap_future(self._pool_spawner.submit(self._build_x))
        except Exception as exc:  # noqa: BLE001 - a missing bare X only costs a slower cold start
            logger.log(logging.INFO if self.closed else logging.ERROR, "could not start a bare X server: %s", exc)
            return
        finally:
            self._building_x -= 1
        if self.closed:
            await self._destroy_async(x)
        else:
            with self._display_lock:
                self._bare_x.append(x)

    def _destroy(self, desk: Desktop) -> None:
        """Stop ``desk`` and give back its display and slot, whatever its stop raised: a stop error is logged and
        counted (``stop_errors`` in /metrics), never a failed terminate or a slot lost for good (issue 80)."""
        try:
            desk.stop()
        except Exception as exc:  # noqa: BLE001 - (a VM's stop; Desktop.stop logs and keeps its own errors)
            logger.error("stopping %s failed: %s", getattr(desk, "display", "a desktop"), exc, exc_info=True)
            self.metrics.count("stop_errors")
        finally:
            self._release_display(getattr(desk, "display_num", -1))
            slot = getattr(desk, "slot", None)
            if slot is not None:
                with self._display_lock:
                    self._free_slots.append(slot)
        errors = len(getattr(desk, "stop_errors", ()))
        if errors:
            self.metrics.count("stop_errors", errors)

    async def _destroy_async(self, desk: Desktop) -> None:
        await asyncio.to_thread(self._destroy, desk)

    async def discard(self, desk: Desktop) -> None:
        """End a desktop made outside the pool that no execution took (a cancelled fork's VM child)."""
        await self._destroy_async(desk)

    # -- pool ---------------------------------------------------------------------------------------
    def _touch(self, spec: DesktopSpec) -> None:
        key = pool_key(spec)
        self._recent.pop(key, None)
        self._recent[key] = spec
        keep = max(1, self.opt.max_spares // max(1, self.opt.pool_size))
        while len(self._recent) > keep:
            old, _ = self._recent.popitem(last=False)
            for desk in self._spares.pop(old, ()):
                self._spawn_bg(self._destroy_async(desk))

    def _spawn_bg(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refill(self) -> None:
        if self.closed or self.opt.pool_size <= 0:
            return
        total = sum(len(d) for d in self._spares.values()) + sum(self._building.values())
        for key in reversed(self._recent):
            # running desktops that come back to this profile's spares when their executions end
            returning = sum(1 for ex in self.executions.values()
                            if pool_key(ex.desktop.spec) == key and self._reusable(ex.desktop))
            while (len(self._spares[key]) + self._building[key] + returning < self.opt.pool_size
                   and total < self.opt.max_spares):
                self._building[key] += 1
                total += 1
                self._spawn_bg(self._build_spare(key, self._recent[key]))

    async def _build_spare(self, key, spec: DesktopSpec) -> None:
        try:
            desk = await asyncio.wrap_future(self._pool_spawner.submit(self._build, spec))
        except Exception as exc:  # noqa: BLE001 - a failed spare only costs a cold start later
            logger.log(logging.INFO if self.closed else logging.ERROR, "could not build a spare desktop%s: %s",
                       " (shutting down)" if self.closed else "", exc)
            return
        finally:
            self._building[key] -= 1
        if self.closed or key not in self._recent:
            await self._destroy_async(desk)
        else:
            self._spares[key].append(desk)

    def _take_spare(self, spec: DesktopSpec) -> Desktop | None:
        """A spare for ``spec``: one that shows its page (a browser: the page it has loaded now, which after reuse
        need not be the one it was built with) or else one built exactly for it, if there is one; else any of its
        pool key (a browser then loads the page): one whose page another spare shows too, else the oldest."""
        spares = self._spares.get(pool_key(spec))
        if not spares:
            return None
        page = getattr(spec, "page", None)
        shown = [getattr(desk, "loaded_page", None) for desk in spares]
        for desk, its in zip(spares, shown):
            if (its == page) if page and its is not None else desk.spec == spec:
                spares.remove(desk)
                return desk
        for desk, its in zip(spares, shown):
            if its is not None and shown.count(its) > 1:
                spares.remove(desk)
                return desk
        return spares.popleft()

    def prewarm(self, tasks: list[TaskDef]) -> None:
        for t in tasks:
            self._touch(t.desktop_spec(self.opt.width, self.opt.height))
        self._refill()

    def pool_stats(self) -> dict:
        return {"spares": sum(len(d) for d in self._spares.values()), "building": sum(self._building.values()),
                "profiles": len(self._recent), "bare_x": len(self._bare_x), "free_slots": len(self._free_slots)}

    # -- executions ---------------------------------------------------------------------------------
    def capacity(self) -> dict:
        """``{"free": n, "max": m}``: executions it can still create now, and at most at once (a fleet places
        groups by it: cua_rl/genv/fleet.py). Free counts what it can really start: room under ``max_executions``,
        and no more than the desktops it holds ready (spares, bare X servers) and the slots left to build others
        in (a slot lost would otherwise show as room that every create fails on, issue 80)."""
        most = self.opt.max_executions
        room = most - len(self.executions) - self._reserved
        with self._display_lock:
            startable = len(self._free_slots) + len(self._bare_x)
        startable += sum(len(d) for d in self._spares.values())
        return {"free": max(0, min(room, startable)), "max": most}

    def states(self) -> dict[str, int]:
        """Executions by state now (metrics.STATES)."""
        evaluating = sum(1 for ex in self.executions.values()
                         if ex.evaluation is not None and not ex.evaluation.done())
        return {"creating": self._reserved, "running": len(self.executions) - evaluating,
                "evaluating": evaluating, "terminating": self._terminating}

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def _check_room(self, n: int) -> None:
        if self.closed:
            raise CapacityError("the gym is shutting down")
        running = len(self.executions) + self._reserved
        if running + n > self.opt.max_executions:
            more = f"{n} more" if n > 1 else "one more"
            raise CapacityError(f"concurrency cap reached: {running} executions running, at most "
                                f"{self.opt.max_executions} ({more} asked for); terminate one or retry later")

    @contextlib.asynccontextmanager
    async def reserve(self, n: int):
        """Room for ``n`` executions, held until the block ends: a fork's children all fit, or none is made
        (``CapacityError``). ``create(task, reserved=r)`` and ``adopt(task, desk, r)`` take their room from the
        reservation ``r`` this yields."""
        self._check_room(n)
        reservation = Reservation(n)
        self._reserved += n
        try:
            yield reservation
        finally:
            self._reserved -= reservation.left

    def _take_room(self, reserved: "Reservation | None") -> None:
        """An execution is about to be registered: its room leaves the reservation (it counts as running)."""
        if reserved is not None:
            if reserved.left <= 0:
                raise RuntimeError("more executions registered than were reserved")
            reserved.left -= 1
            self._reserved -= 1

    async def run_blocking(self, fn, *args):
        """``fn(*args)`` on a create spawner thread (``procs``: what it starts dies with the gym)."""
        return await asyncio.wrap_future(self._create_spawner.submit(functools.partial(fn, *args)))

    async def adopt(self, task: TaskDef, desk: Desktop, reserved: "Reservation") -> Execution:
        """A desktop made outside the pool (a forked VM) as a new execution of ``task``; destroyed instead when
        the gym is closing (``CapacityError``)."""
        if self.closed:
            await self._destroy_async(desk)
            raise CapacityError("the gym is shutting down")
        self._take_room(reserved)
        now = time.monotonic()
        ex = Execution(uuid.uuid4().hex, task, desk, now, now, from_pool=False)
        self.executions[ex.execution_id] = ex
        return ex

    async def create(self, task: TaskDef, reserved: "Reservation | None" = None) -> Execution:
        """A new execution of ``task`` on a spare (or a desktop built now); ``reserved``: its room comes from
        that reservation (``reserve``: a fork's child) instead of being checked here."""
        if reserved is None:
            self._check_room(1)
        elif self.closed:
            raise CapacityError("the gym is shutting down")
        own = reserved is None
        self._reserved += own
        try:
            spec = task.desktop_spec(self.opt.width, self.opt.height)
            self._touch(spec)
            desk = self._take_spare(spec)
            from_pool = desk is not None
            if desk is None:
                desk = await self._build_now(spec)
                if desk.uses_x:
                    self.refill_x()
            now = time.monotonic()
            served = getattr(desk, "episodes", 0)
            if hasattr(desk, "episodes"):
                desk.episodes = served + 1
            ex = Execution(uuid.uuid4().hex, task, desk, now, now, from_pool, reused=served > 0)
            if self.closed:
                await self._destroy_async(desk)
                raise CapacityError("the gym is shutting down")
            self._take_room(reserved)
            self.executions[ex.execution_id] = ex
            self._refill()
        finally:
            self._reserved -= own
        logger.info("execution %s of task %s on %s (%s)", ex.execution_id, task.task_id, desk.display,
                    "warm" if from_pool else "cold")
        return ex

    async def _build_now(self, spec: DesktopSpec) -> Desktop:
        """A desktop built for a create on a spawner thread. If the gym starts shutting down first (``drain``) the
        caller hears ``CapacityError`` at once instead of holding the server's shutdown; if the caller is cancelled,
        the same. Either way the build finishes on its thread and its desktop is destroyed (``close`` waits)."""
        build = asyncio.ensure_future(asyncio.wrap_future(self._create_spawner.submit(self._build, spec)))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({build, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not build.done():
                self._spawn_bg(self._destroy_when_built(build))
        if not build.done():
            raise CapacityError("the gym is shutting down")
        return build.result()

    async def _destroy_when_built(self, build: asyncio.Future) -> None:
        try:
            desk = await build
        except Exception:   # noqa: BLE001 - a failed build has nothing to destroy; _build logged why
            return
        await self._destroy_async(desk)

    def drain(self) -> None:
        """The server is about to stop: refuse new executions and release creates waiting on a build, so the
        requests in flight end before the server's grace period does (actions and evaluations go on)."""
        self._closing.set()

    def get(self, execution_id: str) -> Execution | None:
        ex = self.executions.get(execution_id)
        if ex is not None:
            ex.last_used = time.monotonic()
        return ex

    async def terminate(self, execution_id: str) -> bool:
        ex = self.executions.pop(execution_id, None)
        if ex is None:
            return False
        self._terminating += 1
        try:
            async with ex.lock:  # let an action in flight finish first
                if ex.live is not None:
                    await asyncio.wrap_future(self._create_spawner.submit(ex.live.stop))
                    ex.live = None
                if not await self._recycle(ex.desktop):
                    await self._destroy_async(ex.desktop)
        finally:
            self._terminating -= 1
            self.metrics.count("terminated")
        logger.info("terminated execution %s", execution_id)
        return True

    async def live_view(self, execution_id: str) -> LiveView:
        """The execution's live view, started now if it is not running (KeyError: no such execution)."""
        ex = self.executions[execution_id]
        async with ex.lock:
            if ex.live is None or not ex.live.alive:
                if ex.live is not None:   # x11vnc or websockify died: start both again
                    await asyncio.wrap_future(self._create_spawner.submit(ex.live.stop))
                desk = ex.desktop
                machine = getattr(desk, "machine", None)          # a VM: QEMU's own VNC server
                if machine is None and getattr(desk, "display_num", -1) < 0:
                    raise LiveViewError("this desktop has neither an X display nor a VNC server to watch")
                root = getattr(desk, "root", None) or getattr(machine, "root", None)
                ex.live = await asyncio.wrap_future(self._create_spawner.submit(functools.partial(
                    LiveView.start, desk.display, host=self.opt.live_view_host, log_dir=root,
                    vnc=machine.open_vnc if machine is not None else None, uid=getattr(desk, "uid", None),
                    xauthority=getattr(desk, "xauth_file", None))))
            ex.last_used = time.monotonic()
            return ex.live

    def _reusable(self, desk: Desktop) -> bool:
        """Whether ``desk`` serves another execution when this one ends (``reuse_browsers``)."""
        return hasattr(desk, "recycle") and getattr(desk, "episodes", 0) < self.opt.reuse_browsers

    async def _recycle(self, desk: Desktop) -> bool:
        """A used browser desktop back among its profile's spares, its page loaded again; False when it is not
        to be reused (reuse off or used up, the gym closing, its profile gone or full, the reload failed)."""
        key = pool_key(desk.spec)
        if (self.closed or not self._reusable(desk) or key not in self._recent
                or len(self._spares[key]) + self._building[key] >= self.opt.pool_size):
            return False
        try:
            await asyncio.to_thread(desk.recycle, keep_document=self.opt.restart_in_page)
        except Exception as exc:  # noqa: BLE001 - a browser that cannot reload is rebuilt instead
            logger.warning("could not reuse the browser on %s (%s): building a new one", desk.display, exc)
            return False
        if self.closed or key not in self._recent:
            return False
        self._spares[key].append(desk)
        return True

    async def reap_forever(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.opt.reap_interval_s)
            now = time.monotonic()
            quota = self.opt.limits.home_bytes
            for eid, ex in list(self.executions.items()):
                if now - ex.last_used > self.opt.ttl_s and not ex.lock.locked():
                    logger.warning("reaping execution %s: idle %.0f s (ttl %.0f s)", eid, now - ex.last_used,
                                   self.opt.ttl_s)
                    await self.terminate(eid)
                elif not ex.desktop.home_mounted and await asyncio.to_thread(ex.desktop.home_usage,
                                                                             quota) > quota:
                    # The disk limit where HOME is a host folder (no tmpfs: not root): a HOME over quota
                    # ends its execution (the agent filled the disk).
                    logger.warning("ending execution %s: HOME over its %d MiB quota", eid, quota >> 20)
                    await self.terminate(eid)

    async def close(self) -> None:
        """End every execution and spare, then the spawner threads."""
        self.drain()
        # Spares being built finish and destroy themselves (they see closed); never cancel a build
        # mid-way, or its desktop would have no owner.
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await asyncio.gather(*(self.terminate(eid) for eid in list(self.executions)), return_exceptions=True)
        spares = [d for dq in self._spares.values() for d in dq] + list(self._bare_x)
        self._spares.clear()
        self._bare_x.clear()
        await asyncio.gather(*(self._destroy_async(d) for d in spares), return_exceptions=True)
        await asyncio.to_thread(self._create_spawner.close)
        await asyncio.to_thread(self._pool_spawner.close)
        forget_templates(self.workdir)
        shutil.rmtree(self.workdir, ignore_errors=True)
        with self._display_lock:   # every desktop is ended: its uid is free for other gyms
            for _, claim in self._slot_uids.values():
                os.close(claim)
            self._slot_uids.clear()
