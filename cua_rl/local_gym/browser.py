"""Browser desktops: Chromium in kiosk mode on the desktop's own Xvfb display, inside the same sandbox.

Why this shape:
- The agent sees the browser exactly as it sees the other desktops: screenshots of the X display and
  X input events (no browser automation on the agent's side). Chromium runs headful, full screen, at
  ``zoom`` device pixels per CSS pixel so small pages stay readable.
- The sandbox is the desktops' one (``Desktop.bwrap_argv``): no network namespace beyond loopback, its own
  display socket only, a fresh HOME (the browser profile lives there), rlimits, parent-death signals.
  Chromium keeps its own namespace sandbox inside it.
- The gym drives the browser over the DevTools *pipe* (``cdp.CDPPipe``), never a port.
- Pages come from a host folder (``BrowserSpec.site_root``) that the sandbox cannot see: the gym answers
  the browser's requests for ``SITE_ORIGIN`` itself (DevTools ``Fetch`` interception) and refuses every other
  URL. So the site is served straight from where it is installed (e.g. a package inside a root-only
  virtual environment), nothing listens on any socket, and a page can reach nothing else.

A desktop is still built for one execution and destroyed with it. ``BrowserSpec.page`` is preloaded when the
desktop is built, so a pooled desktop already shows its page; ``pool_key`` leaves the page out, so any
spare browser can serve any page of the same size (``navigate`` then loads the other page).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import logging
import mimetypes
import os
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from Xlib import X, display as xdisplay, error as xerror

from . import procs
from .cdp import CDPError, CDPPipe
from .desktop import SANDBOX_HOME, Desktop, DesktopSpec, SandboxLimits, _rlimits
from .xinput import char_keysym

logger = logging.getLogger(__name__)

SITE_ORIGIN = "http://gym.test"       # .test is reserved (RFC 2606): it can never be a real site
WM_CLASS = "Chromium"
MAX_SITE_FILE = 8 << 20
# Installed in every document before its own scripts: counts the trusted input events the page receives, and
# keeps the last 64 of them (type, key, target, focused element) for a lost input's evidence (``input_log``).
INPUT_COUNTER_JS = """(() => { let n = 0; const log = [];
  const name = e => e ? (e.id ? '#' + e.id : (e.tagName || e.nodeName || '?').toLowerCase()) : null;
  for (const t of ['mousedown', 'mouseup', 'keydown', 'keyup', 'wheel'])
    addEventListener(t, e => { if (!e.isTrusted) return; n++;
      log.push([t, e.key === undefined ? null : e.key, name(e.target), name(document.activeElement),
                document.hasFocus(), Math.round(performance.now())]);
      if (log.length > 64) log.shift(); }, true);
  Object.defineProperty(window, '__cuaInputs', {get: () => n});
  Object.defineProperty(window, '__cuaInputLog', {get: () => log.slice()}); })()"""
# How long an action waits for the page to count its input. Pages count theirs within ~10-50 ms; a busy
# machine (load ~10 on 2 cores in CI) can take longer, and a timeout there let a submit click overtake typed
# keys (enter-text-2 scored -1 once). Only input that never reaches the page (a native popup) waits it out.
INPUT_WAIT_S = 2.0
# ... unless the page has counted none of the action's events yet: a native popup gets none of the keys typed
# into it but always the press that opened it, so nothing counted means a busy page (a cold browser beside
# other browsers starting on a loaded machine), and input sent on would overtake. CI saw enter-password on a
# cold browser score -1 once (the second field's text most likely typed before its click arrived).
INPUT_NONE_S = 8.0
# How long one reading of that count may take. A cold browser on a loaded machine can take seconds to answer;
# when a 2 s reading timed out the action skipped its wait altogether, so text typed right after a click could
# overtake the click (a likely cause of enter-text-dynamic and simple-arithmetic each losing their text once in
# a CI run on a cold browser: the text never reached the field).
INPUT_READ_S = 10.0
# How long an action waits for the page to have painted after its input (``BrowserDesktop.painted``): two
# animation frames, ~33 ms at 60 Hz; a page that does not answer in time is logged and the action goes on.
PAINT_WAIT_S = 2.0
RAF2_JS = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"
CHROMIUM_FLAGS = (
    "--kiosk", "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-quic",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
    "--disable-extensions", "--password-store=basic", "--noerrdialogs", "--hide-crash-restore-bubble",
    "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
    "--disable-smooth-scrolling", "--overscroll-history-navigation=0", "--force-color-profile=srgb",
    "--remote-debugging-pipe", f"--user-data-dir={SANDBOX_HOME}/.chromium",
)

# The profile's settings, written into every browser's fresh HOME: no password manager and no autofill. Chromium
# offered to save a password typed into an earlier episode of a reused page ("Save password?" over the next
# episode's task, taking its input) and would fill one episode's entries into another's fields; the reference
# environment's headless Chromium shows neither.
CHROMIUM_PREFERENCES = {"credentials_enable_service": False, "profile": {"password_manager_enabled": False},
                        "autofill": {"enabled": False, "profile_enabled": False, "credit_card_enabled": False}}
CHROMIUM_FILES = ((".chromium/Default/Preferences", json.dumps(CHROMIUM_PREFERENCES)),)


@dataclass(frozen=True)
class BrowserSpec(DesktopSpec):
    """A desktop that is one full-screen browser. ``page`` is a path under ``site_root`` ('' = blank)."""

    files: tuple[tuple[str, str], ...] = CHROMIUM_FILES
    site_root: str = ""
    page: str = ""
    zoom: float = 1.0

    @property
    def desktop_class(self) -> type["BrowserDesktop"]:
        return BrowserDesktop

    @property
    def pool_key(self) -> "BrowserSpec":
        """Spares are interchangeable across pages: the pool keys them without the page."""
        return dataclasses.replace(self, page="")

    def url(self, page: str | None = None) -> str:
        return f"{SITE_ORIGIN}/{(self.page if page is None else page).lstrip('/')}"


class _SiteFiles:
    """Read-once cache of the served files (package files do not change while the gym runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, bytes] = {}

    def read(self, root: str, url_path: str) -> bytes | None:
        """The file at ``url_path`` under ``root``, or None when it is missing or resolves outside ``root``."""
        root_real = os.path.realpath(root)
        path = os.path.realpath(os.path.join(root_real, url_path.lstrip("/")))
        if not path.startswith(root_real + os.sep):
            return None
        with self._lock:
            data = self._files.get(path)
        if data is None:
            if not os.path.isfile(path) or os.path.getsize(path) > MAX_SITE_FILE:
                return None
            data = Path(path).read_bytes()
            with self._lock:
                self._files[path] = data
        return data


SITE_FILES = _SiteFiles()


@dataclass
class BrowserDesktop(Desktop):
    """A ``Desktop`` whose only app is Chromium, driven by the gym over DevTools.

    Chromium stays a trusted X client of its display whatever ``Desktop.untrusted_apps`` says: as an untrusted one
    it has no XKEYBOARD and reads the keys the gym sends through the wrong keymap ("MiXeD" typed as "mMimXemD"). No
    program of the policy's runs on a browser desktop: it acts on pages (served by the gym, nothing else reachable),
    whose scripts cannot speak X. The gym's connections are re-opened all the same if one is ever lost (env.py)."""

    untrusted_apps = False

    cdp: CDPPipe | None = dataclasses.field(default=None, repr=False)
    session: str | None = None
    loaded_page: str = ""
    episodes: int = 0            # executions served (more than one only with GymOptions.reuse_browsers)
    loaded_unseen: bool = False  # a document loaded (navigate) that no episode start has seen on the screen yet

    # -- start (hooks of Desktop.start) --------------------------------------------------------------
    def _start_sandbox(self, limits: SandboxLimits) -> None:
        spec: BrowserSpec = self.spec  # type: ignore[assignment]
        flags = [*CHROMIUM_FLAGS, f"--force-device-scale-factor={spec.zoom:g}", "--window-position=0,0",
                 f"--window-size={spec.width},{spec.height}", "about:blank"]
        # The pipe arrives as stdin/stdout (bwrap passes those on) and becomes fds 3 and 4 of Chromium.
        script = "exec chromium " + " ".join(shlex.quote(f) for f in flags) + " 3<&0 4>&1 0</dev/null 1>&2"
        argv = self.bwrap_argv(limits, ["/bin/sh", "-c", script])
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        try:
            with open(self.root / "apps.log", "wb") as log:
                proc = procs.popen(argv, uid=self.uid, env={"PATH": "/usr/bin:/bin"}, stdin=to_browser_r,
                                   stdout=from_browser_w, stderr=log, cwd=str(self.root),
                                   preexec=_rlimits(limits, self.uid))
        except BaseException:
            for fd in (to_browser_w, from_browser_r):
                os.close(fd)
            raise
        finally:
            os.close(to_browser_r)   # the browser holds these ends now; EOF on ours means it exited
            os.close(from_browser_w)
        self.procs.append(proc)
        self.cdp = CDPPipe(to_browser_w, from_browser_r, name=f"chromium{self.display}")

    def _wait_for_windows(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self._attach_page(deadline)
        self._wait_mapped(deadline)
        spec: BrowserSpec = self.spec  # type: ignore[assignment]
        if spec.page:
            self.navigate(spec.page, timeout_s=max(1.0, deadline - time.monotonic()))

    def _attach_page(self, deadline: float) -> None:
        """Attach to the browser's page, then answer its requests for the site (and only those)."""
        assert self.cdp is not None
        try:
            targets = self.cdp.call("Target.getTargets", timeout_s=max(0.1, deadline - time.monotonic()))
        except (CDPError, TimeoutError) as exc:
            raise RuntimeError(f"chromium on {self.display} did not start: {exc}: {self._log_tail()}") from exc
        pages = [t for t in targets.get("targetInfos", []) if t.get("type") == "page"]
        if not pages:
            raise RuntimeError(f"chromium on {self.display} has no page: {targets}")
        reply = self.cdp.call("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True})
        self.session = reply["sessionId"]
        self.cdp.on("Fetch.requestPaused", self._answer_request)
        self.cdp.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, self.session)
        # Without Page.enable, Chromium 156 accepts the script and never runs it (the counter was missing on
        # every page, and each action's wait for its input silently did nothing); navigate() checks it is there.
        self.cdp.call("Page.enable", {}, self.session)
        self.cdp.call("Page.addScriptToEvaluateOnNewDocument", {"source": INPUT_COUNTER_JS}, self.session)

    def _wait_mapped(self, deadline: float) -> None:
        d = xdisplay.Display(self.display)
        try:
            client_list = d.intern_atom("_NET_CLIENT_LIST")
            root = d.screen().root

            def mapped() -> bool:
                prop = root.get_full_property(client_list, X.AnyPropertyType)
                for wid in (prop.value if prop else []):
                    try:
                        win = d.create_resource_object("window", wid)
                        cls = win.get_wm_class()
                        if cls and cls[1] == WM_CLASS and win.get_attributes().map_state == X.IsViewable:
                            return True
                    except xerror.XError:
                        continue
                return False

            if not procs.wait_until(mapped, max(0.1, deadline - time.monotonic()), 0.01):
                raise RuntimeError(f"chromium window did not map on {self.display}: {self._log_tail()}")
        finally:
            d.close()

    def _log_tail(self) -> str:
        try:
            lines = (self.root / "apps.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line for line in lines[-12:] if "dbus" not in line.lower())[-800:]

    # -- serving the site ---------------------------------------------------------------------------
    def _answer_request(self, params: dict, session: str | None) -> None:
        """Fetch.requestPaused, on the DevTools reader thread: files of the site, nothing else."""
        assert self.cdp is not None
        request_id, url = params["requestId"], params.get("request", {}).get("url", "")
        spec: BrowserSpec = self.spec  # type: ignore[assignment]
        parts = urlsplit(url)
        data = None
        if f"{parts.scheme}://{parts.netloc}" == SITE_ORIGIN and spec.site_root:
            data = SITE_FILES.read(spec.site_root, parts.path)
        if data is None:
            if not url.startswith(SITE_ORIGIN + "/"):
                logger.debug("%s: refused %s", self.display, url[:200])
                self.cdp.send("Fetch.failRequest", {"requestId": request_id, "errorReason": "BlockedByClient"},
                              session)
                return
            self.cdp.send("Fetch.fulfillRequest", {"requestId": request_id, "responseCode": 404, "body": ""},
                          session)
            return
        ctype = mimetypes.guess_type(parts.path)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"   # pages without <meta charset> would otherwise be read as Windows-1252
        self.cdp.send("Fetch.fulfillRequest", {
            "requestId": request_id, "responseCode": 200,
            "responseHeaders": [{"name": "Content-Type", "value": ctype},
                                {"name": "Cache-Control", "value": "max-age=86400"}],
            "body": base64.b64encode(data).decode()}, session)

    # -- driving the page ---------------------------------------------------------------------------
    def evaluate(self, expression: str, timeout_s: float = 10.0):
        """Blocking: the JSON value of ``expression`` in the page; a JS exception is a ``CDPError``."""
        assert self.cdp is not None
        reply = self.cdp.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                              self.session, timeout_s)
        return _value(reply, expression)

    async def aevaluate(self, expression: str, timeout_s: float = 10.0, await_promise: bool = False):
        """The asyncio form of ``evaluate``; ``await_promise``: the value the expression's promise resolves to."""
        assert self.cdp is not None
        reply = await self.cdp.acall("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                          **({"awaitPromise": True} if await_promise else {})},
                                     self.session, timeout_s)
        return _value(reply, expression)

    def navigate(self, page: str, ready: str = "true", timeout_s: float = 10.0) -> None:
        """Blocking: load ``page`` (a path under the site) and wait until it has loaded and ``ready`` is true."""
        spec: BrowserSpec = self.spec  # type: ignore[assignment]
        url = spec.url(page)
        assert self.cdp is not None
        reply = self.cdp.call("Page.navigate", {"url": url}, self.session, timeout_s)
        if reply.get("errorText"):
            raise RuntimeError(f"{self.display}: loading {url} failed: {reply['errorText']}")
        check = (f"location.href === {json.dumps(url)} && document.readyState === 'complete' "
                 f"&& !!({ready})")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.evaluate(f"(() => {{ try {{ return {check}; }} catch (e) {{ return false; }} }})()"):
                    break
            except CDPError:
                pass  # the context is being replaced while the new document commits
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.display}: {url} did not load within {timeout_s:.0f} s")
            time.sleep(0.003)
        if self.evaluate("typeof window.__cuaInputs") != "number":
            raise RuntimeError(f"{self.display}: {url} loaded without the input counter (INPUT_COUNTER_JS): "
                               "actions could not wait for the page to receive their input")
        self.loaded_page, self.loaded_unseen = page, True

    def recycle(self, timeout_s: float = 10.0, keep_document: bool = False) -> None:
        """Blocking: ready this used browser for another episode (``GymOptions.reuse_browsers``). The site's
        storage (cookies, local and session storage, databases, caches of the origin) is cleared, the keyboard's
        modifiers released and the X selections dropped (clipboard, primary: nothing to paste); the pointer is
        the suite's (each MiniWoB++ episode puts it in the corner, ``MiniwobSuite.begin``). The profile keeps no
        form history or passwords (``CHROMIUM_PREFERENCES``). Its page is then loaded again, a new document: the
        last episode's DOM, scripts, timers and the suite's patches are gone. ``keep_document``
        (``GymOptions.restart_in_page``) skips the reload when the document is still the loaded page (the suite
        restarts its episode in it, as the MiniWoB++ package does); a document the last episode navigated away
        from is loaded again all the same. Either way what is loaded (the same page, from cache) stays."""
        assert self.cdp is not None
        self.cdp.call("Storage.clearDataForOrigin", {"origin": SITE_ORIGIN, "storageTypes": "all"},
                      self.session, timeout_s)
        if self.xinput is not None:
            self.xinput.reset_modifiers()
            # The X server outlives the episode: what it copied or selected would be pasted into the next one
            # (Ctrl+V, a middle click: one episode's typed answer in another's field).
            self.xinput.clear_selections()
        if keep_document and self._shows_loaded_page():
            return
        self.navigate(self.loaded_page, timeout_s=timeout_s)

    def _shows_loaded_page(self) -> bool:
        """Whether the document is still the one ``navigate`` loaded (same URL, its input counter installed)."""
        url = self.spec.url(self.loaded_page)   # type: ignore[attr-defined]
        try:
            return self.evaluate(f"location.href === {json.dumps(url)} && typeof window.__cuaInputs === 'number'")
        except CDPError:
            return False

    # -- input ordering -----------------------------------------------------------------------------
    # Chromium can hand keys to the page before a click that preceded them on the X server has moved the
    # focus (seen under load: text typed right after clicking a field landed in the previous field). So an
    # action on a browser desktop returns only once the page has received its input events.
    async def input_count(self) -> int | None:
        """The page's count of input events; None when there is none to read (no counter, the document is
        being replaced) or the page did not answer within ``INPUT_READ_S`` (logged)."""
        try:
            return await self.aevaluate("window.__cuaInputs === undefined ? null : window.__cuaInputs", INPUT_READ_S)
        except CDPError:
            return None
        except TimeoutError:
            logger.info("%s: the page did not report its input count within %.0f s", self.display, INPUT_READ_S)
            return None

    async def painted(self, timeout_s: float = PAINT_WAIT_S) -> bool:
        """Wait until the page has produced a frame after what it has received (two animation frames: the second
        runs once the first, which holds the input's effect, is committed), so the settle wait that follows sees
        its pixels. Without it a checkbox's tick could reach the X server after the action's settle: the
        screenshot after a click showed the box unticked while the page had it ticked (a fork's child, replayed,
        then differed from its parent's capture). False when the page did not answer within ``timeout_s``."""
        try:
            return await self.aevaluate(RAF2_JS, timeout_s, await_promise=True)
        except (CDPError, TimeoutError):
            logger.info("%s: the page did not paint within %.1f s of its input", self.display, timeout_s)
            return False

    async def input_log(self) -> list | None:
        """The page's last 64 trusted input events: [type, key, target, focused element, document has focus,
        ms since the document started] each (``INPUT_COUNTER_JS``); None when the page has no counter."""
        return await self.aevaluate("window.__cuaInputLog === undefined ? null : window.__cuaInputLog")

    async def wait_input(self, before: int | None, at_least: int, timeout_s: float = INPUT_WAIT_S) -> bool:
        """Wait until the page counted ``at_least`` more input events than ``before`` (False on timeout:
        e.g. the input went to a native popup, or the page is being replaced)."""
        if before is None or at_least <= 0:
            return True
        start = time.monotonic()
        while True:
            now = await self.input_count()
            if now is None or now < before or now - before >= at_least:
                return True
            waited = time.monotonic() - start
            if waited > timeout_s and (now > before or waited > max(timeout_s, INPUT_NONE_S)):
                (logger.info if now > before else logger.warning)(
                    "%s: the page counted %d of %d input events within %.1f s", self.display, now - before,
                    at_least, waited)
                return False
            await asyncio.sleep(0.003)

    # -- stop ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """``Desktop.stop`` between closing the DevTools pipe and joining its reader (each step runs whatever
        another raised)."""
        cdp, self.cdp = self.cdp, None
        if cdp is not None:
            self._step("close the DevTools pipe", cdp.close)
        super().stop()
        if cdp is not None:   # the browser is gone: its reader thread sees EOF and ends
            self._step("end the DevTools reader", functools.partial(cdp.close, join_s=2.0))


def page_events(action, xin) -> int:
    """How many counted input events (``INPUT_COUNTER_JS``) an ``actions.Action`` gives the page at least.
    Keys count a press and a release each, Shift's included (``XInput.presses``): counting two per character
    let an action on upper-case text return halfway through it, and the next input overtake the rest."""
    if action.type == "click":
        return 2 * action.count
    if action.type in ("drag", "press"):
        return 2
    if action.type == "type":   # each key's release: the page has its text once they arrived
        return 2 * xin.presses([char_keysym(ch) for ch in action.text])
    if action.type == "key":
        return 2 * xin.presses(action.keysyms, combo=True)
    if action.type == "scroll":
        return 1 if action.dx or action.dy else 0
    return 0


def _value(reply: dict, expression: str):
    if "exceptionDetails" in reply:
        details = reply["exceptionDetails"]
        text = details.get("exception", {}).get("description") or details.get("text", "exception")
        raise CDPError(f"page raised {text.splitlines()[0]} in {expression[:80]!r}")
    return reply.get("result", {}).get("value")
