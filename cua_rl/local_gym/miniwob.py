"""MiniWoB++ as a gym suite: every task page of the installed ``miniwob`` package, on browser desktops.

Why MiniWoB++: the classic RL benchmark for GUI agents, with reward functions written by its authors and
run in the page itself; nobody here wrote its tasks. Nothing is copied out of the package: pages are
served from the installed package folder (``browser.BrowserSpec.site_root``), and what the gym says about a
task comes from the package's own files, read without importing it (importing it registers gymnasium
environments and loads selenium, neither of which is used here):

- the task list: ``html/miniwob/*.html`` (130 pages; the 3 FlightWoB tasks under ``html/flight`` are
  different-size wrapper pages and are not served);
- description, example utterances, utterance fields and notes: the docstrings of ``envs/miniwob_envs.py``;
- ``nondeterministic`` (the package's own flag: a seed does not pin everything, e.g. "today" in a date
  picker) and ``unregistered`` (pages the package does not register as environments) from ``registration.py``;
- difficulty: a name's own ``-easy``/``-medium``/``-hard`` suffix, else the time budget the authors gave the
  page (``core.EPISODE_MAX_TIME``: 7-10 s easy, 15-20 s normal, 30 s hard);
- category: the interaction the task name leads with (``CATEGORY_RULES``).

One execution is one episode of one seeded instance: ``Math.seedrandom(seed)`` then the page's own
``core.startEpisodeReal()``, exactly as the package's selenium driver does, so a task plus a seed is one
utterance and layout. The in-page timer (10-30 s, made for scripted agents) is replaced by
``time_limit_s`` (the gym's ``miniwob_time_limit_s``, 1 hour by default): a slow model never loses an episode
to it, and a forgotten one still ends. The reward is the page's raw reward (``WOB_RAW_REWARD_GLOBAL``, no
time penalty: model latency is not the agent's skill), clipped to [0, 1]; the raw and time-scaled values
and the page's reason stay in the evaluation details.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from .browser import BrowserDesktop, BrowserSpec
from .cdp import CDPError
from .curriculum import SEED_BITS
from .screen import settle

logger = logging.getLogger(__name__)

TASK_CSS_SIZE = (160, 210)          # the MiniWoB++ task area in CSS pixels (#wrap)
DEFAULT_BUDGET_MS = 10_000          # core.js's own EPISODE_MAX_TIME
BEGIN_CHANGE_WAIT_S = 0.3           # a used page's running episode replaced: its first pixels within this, as a click's
# The task replaces the START (or DONE) cover: its first frame is sure to differ, so the start waits for it this long.
# A new browser's first episode on a loaded machine took over 0.3 s to show, and its reset returned the START cover.
BEGIN_FIRST_FRAME_S = 5.0
# Before the start: the page's current frame (two animation frames) reaches the X server within this, or never will.
PAINT_SETTLE_S = 0.05
MAX_TIME_LIMIT_S = 2_000_000        # setTimeout takes at most 2^31-1 ms
# First matching (prefix or exact name) wins; order matters.
CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("email-inbox", "web_app"), ("social-media", "web_app"), ("book-flight", "web_app"), ("buy-ticket", "web_app"),
    ("order-food", "web_app"), ("phone-book", "web_app"), ("daily-calendar", "web_app"), ("stock-market", "web_app"),
    ("search-engine", "web_app"), ("terminal", "web_app"), ("text-editor", "web_app"), ("navigate-tree", "web_app"),
    ("click-", "click"), ("hover-", "click"), ("button-delay", "click"), ("moving-items", "click"),
    ("ascending-numbers", "click"), ("number-checkboxes", "click"), ("tic-tac-toe", "click"),
    ("enter-", "form"), ("focus-", "form"), ("login-user", "form"), ("form-sequence", "form"),
    ("multi-", "form"), ("sign-agreement", "form"), ("copy-paste", "form"), ("text-transform", "form"),
    ("unicode-test", "form"), ("read-table", "form"),
    ("choose-", "widget"), ("use-", "widget"), ("scroll-text", "widget"),
    ("drag-", "drag_draw"), ("draw-", "drag_draw"), ("resize-", "drag_draw"), ("highlight-text", "drag_draw"),
    ("bisect-angle", "drag_draw"), ("circle-center", "drag_draw"), ("right-angle", "drag_draw"),
    ("find-midpoint", "drag_draw"), ("chase-circle", "drag_draw"),
)
OTHER_CATEGORY = "reasoning"        # arithmetic, counting, guessing, reading: think first, then click or type
CATEGORIES = ("click", "form", "widget", "drag_draw", "web_app", OTHER_CATEGORY)


def package_dir() -> Path:
    """The installed ``miniwob`` package folder (found without importing the package)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.origin:
        raise RuntimeError("the miniwob package is not installed (pyproject.toml lists miniwob==1.1.0; "
                           "run scripts/setup.sh)")
    return Path(spec.origin).parent


def category_of(name: str) -> str:
    """A rule ``"click-"`` matches names starting with it; ``"book-flight"`` that name and its variants."""
    for rule, category in CATEGORY_RULES:
        if name == rule or name.startswith(rule if rule.endswith("-") else rule + "-"):
            return category
    return OTHER_CATEGORY


def difficulty_of(name: str, budget_ms: int) -> str:
    for suffix, level in (("-easy", "easy"), ("-medium", "normal"), ("-hard", "hard")):
        if name.endswith(suffix):
            return level
    return "easy" if budget_ms <= 10_000 else "normal" if budget_ms <= 20_000 else "hard"


@dataclass(frozen=True)
class MiniwobTask:
    number: str
    name: str
    description: str
    category: str
    difficulty: str
    budget_ms: int                                  # the authors' in-page time budget (replaced at run time)
    examples: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()                     # nondeterministic, unregistered, partial_reward
    site_root: str = field(default="", repr=False)

    @property
    def task_id(self) -> str:
        return self.name

    @property
    def page(self) -> str:
        return f"miniwob/{self.name}.html"

    @property
    def instruction(self) -> str:
        """The task in general; each seeded instance has its own concrete utterance (create's reply)."""
        return self.description

    @property
    def fork_note(self) -> str | None:
        """Why a fork of this page is refused (None: it may be forked). The package's own flags: a page it
        marks nondeterministic is not pinned by its seed; the pages it leaves unregistered change with time
        (items that move, a button that appears after a delay, a sequence shown in turn)."""
        if "nondeterministic" in self.flags:
            return "the MiniWoB++ package marks this page nondeterministic (its seed does not pin the instance)"
        if "unregistered" in self.flags:
            return ("the MiniWoB++ package leaves this page unregistered: it changes with time (animations, delays), "
                    "so no replay reaches the parent's state")
        return None

    def desktop_spec(self, width: int, height: int) -> BrowserSpec:
        """Chromium over the whole screen, the task area scaled to fill it (3x on the default 480x630)."""
        zoom = round(min(width / TASK_CSS_SIZE[0], height / TASK_CSS_SIZE[1]), 3)
        return BrowserSpec(apps=(), width=width, height=height, site_root=self.site_root, page=self.page, zoom=zoom)

    def to_wire(self) -> dict:
        tags = [self.difficulty, self.category, "miniwob", *self.flags]
        return {
            "task_id": self.task_id, "id": self.task_id, "task_number": self.number, "name": self.name,
            "description": self.description, "instruction": self.instruction, "tags": tags,
            "category": self.category, "difficulty": self.difficulty,
            "env_config": {"type": "browser", "suite": "miniwob", "page": self.page,
                           "authors_time_budget_s": self.budget_ms / 1000},
            "evaluation": {"reward": "miniwob_page", "score": "clip(raw_reward, 0, 1) once the episode is done",
                           "notes": list(self.notes)},
            "examples": list(self.examples), "utterance_fields": list(self.fields),
            "forkable": self.fork_note is None, "seed_bits": SEED_BITS,
        }


class MiniwobTaskSet:
    """The tasks, looked up like ``tasks.TaskSet``: by name (= id), number ("007" or "7")."""

    def __init__(self, tasks: list[MiniwobTask]) -> None:
        self.tasks = sorted(tasks, key=lambda t: t.number)
        self._by_key: dict[str, MiniwobTask] = {}
        for t in self.tasks:
            for key in (t.name, t.number, str(int(t.number))):
                self._by_key[key] = t

    def get(self, key: str) -> MiniwobTask | None:
        return self._by_key.get(key)

    def __len__(self) -> int:
        return len(self.tasks)


def _docstring_sections(doc: str) -> dict[str, list[str]]:
    """``## Title`` sections of an env docstring -> their non-empty lines (bullets without the ``*``)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        line = line.strip()
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip().lower(), [])
        elif line and current is not None and line != "(none)":
            current.append(line[2:] if line.startswith("* ") else line)
    return sections


def _env_docs(pkg: Path) -> dict[str, dict[str, list[str]]]:
    docs = {}
    for node in ast.parse((pkg / "envs" / "miniwob_envs.py").read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        sub = next((s.value.value for s in node.body if isinstance(s, ast.Assign)
                    and any(getattr(t, "id", "") == "subdomain" for t in s.targets)
                    and isinstance(s.value, ast.Constant)), None)
        if sub:
            docs[sub] = _docstring_sections(ast.get_docstring(node) or "")
    return docs


def _registered(pkg: Path) -> dict[str, bool]:
    """Registered environment name -> its ``nondeterministic`` flag."""
    out = {}
    for node in ast.walk(ast.parse((pkg / "registration.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register":
            kw = {k.arg: k.value for k in node.keywords}
            env_id = kw["id"].value
            name = env_id.split("/", 1)[-1].rsplit("-v", 1)[0]
            nondet = kw.get("nondeterministic")
            out[name] = bool(isinstance(nondet, ast.Constant) and nondet.value)
    return out


def load_miniwob_tasks(pkg: Path | None = None) -> MiniwobTaskSet:
    """Every page of ``html/miniwob`` as a task, numbered in name order."""
    pkg = pkg or package_dir()
    html = pkg / "html"
    docs, registered = _env_docs(pkg), _registered(pkg)
    tasks = []
    for i, page in enumerate(sorted((html / "miniwob").glob("*.html")), start=1):
        name = page.stem
        text = page.read_text(errors="replace")
        budget = re.search(r"core\.EPISODE_MAX_TIME\s*=\s*(\d+)", text)
        budget_ms = int(budget.group(1)) if budget else DEFAULT_BUDGET_MS
        doc = docs.get(name, {})
        title = re.search(r"<title>\s*(.*?)\s*</title>", text, re.S)
        description = " ".join(doc.get("description", [])) or (title.group(1) if title else f"MiniWoB++ {name}")
        notes = tuple(doc.get("additional notes", []))
        flags = []
        if name not in registered:
            flags.append("unregistered")
        elif registered[name]:
            flags.append("nondeterministic")
        if any("partial reward" in n.lower() for n in notes):
            flags.append("partial_reward")
        tasks.append(MiniwobTask(
            number=f"{i:03d}", name=name, description=description, category=category_of(name),
            difficulty=difficulty_of(name, budget_ms), budget_ms=budget_ms,
            examples=tuple(doc.get("example utterances", [])), fields=tuple(doc.get("utterance fields", [])),
            notes=notes, flags=tuple(flags), site_root=str(html)))
    if not tasks:
        raise RuntimeError(f"no MiniWoB++ pages under {html / 'miniwob'}")
    return MiniwobTaskSet(tasks)


# -- one episode in the page --------------------------------------------------------------------------
# Runs once per execution, after the page has loaded (its START cover is up), or in the page the last execution
# used (GymOptions.restart_in_page: the gym's patches are there already). The HUD beside the task
# (last reward, countdown) is hidden: it lies outside the 160x210 task area that MiniWoB++ observations
# crop to, its countdown would change the screen every second, and its "last reward" would leak the score.
_BEGIN_JS = """(() => {
  const covered = !!core.cover_div && core.cover_div.style.display !== 'none';   /* the screen shows no task */
  if (!core.__cuaStart) {   /* the document's first episode: the gym's patches, once */
    const limit = %(limit_ms)d;
    Object.defineProperty(core, 'EPISODE_MAX_TIME', {get: () => limit, set: () => {}, configurable: true});
    const style = document.createElement('style');
    style.textContent = '#reward-display, #click-canvas { display: none !important; }';
    document.head.appendChild(style);
    core.__cuaStart = core.startEpisodeReal;
    core.startEpisodeReal = function () {};   /* one episode per execution: the end cover starts nothing */
  } else {
    core.endEpisode(0);   /* a used page (restart_in_page): a running episode stops, as the package's force_stop */
    /* what core.js carries from episode to episode, as a new document has it: no rewards kept (the hidden HUD's
       last reward and average), no episodes done, no element marked clicked (data-tampered, by episode number) */
    core.wob_latest = '-'; core.wob_scores = []; WOB_EPISODE_ID = 0;
    document.getElementById('reward-display').innerHTML = core.DISPLAY_HTML;
    for (const e of document.querySelectorAll('[data-tampered]')) e.removeAttribute('data-tampered');
    if (document.activeElement) document.activeElement.blur();   /* the focus as in a new document */
  }
  Math.seedrandom(%(seed)d);   /* a number, as the package's driver passes it: seedrandom(7) != seedrandom('7') */
  core.__cuaStart();
  if (core.cover_div) { core.cover_div.innerHTML = 'DONE'; core.cover_div.style.cursor = 'default'; }
  window.__cuaEpisode = %(token)s;
  return {covered: covered, ...%(utterance)s};
})()"""
_UTTERANCE_JS = """(() => {
  const u = core.getUtterance();
  return {ready: typeof WOB_TASK_READY === 'undefined' ? true : !!WOB_TASK_READY,
          utterance: (u && typeof u === 'object') ? String(u.utterance) : String(u),
          fields: (u && typeof u === 'object' && u.fields) ? u.fields : null};
})()"""
_STATE_JS = """(() => ({token: window.__cuaEpisode || null, done: !!WOB_DONE_GLOBAL, env_reward: WOB_REWARD_GLOBAL,
  raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON === undefined ? null : WOB_REWARD_REASON}))()"""
_PAGE_READY_JS = "typeof core === 'object' && !!document.getElementById('sync-task-cover')"
# A fork's task state (fork.py): the document without the hidden HUD (its countdown and time-scaled reward tick),
# every form field's value and checked state, the focus and selection, what is scrolled, and the task's globals
# (done, the raw reward, its reason, the utterance). The episode's token and start time are the execution's own.
_FORK_STATE_JS = """(() => {
  const path = e => { const parts = [];
    for (let n = e; n && n.nodeType === 1 && n !== document.documentElement; n = n.parentElement)
      parts.unshift(n.tagName.toLowerCase() + (n.id ? '#' + n.id : '') + ':'
                    + (n.parentElement ? Array.prototype.indexOf.call(n.parentElement.children, n) : 0));
    return parts.join('>'); };
  const doc = document.documentElement.cloneNode(true);
  const hud = doc.querySelector('#reward-display'); if (hud) hud.remove();
  const fields = [], scrolled = [];
  document.querySelectorAll('input, textarea, select').forEach(
    e => fields.push([path(e), e.value, !!e.checked, e.selectedIndex === undefined ? null : e.selectedIndex]));
  document.querySelectorAll('*').forEach(e => { if (e.scrollTop || e.scrollLeft) scrolled.push([path(e), e.scrollTop, e.scrollLeft]); });
  const a = document.activeElement; let range = null;
  try { range = a && a.selectionStart !== undefined ? [a.selectionStart, a.selectionEnd] : null; } catch (x) {}
  const u = core.getUtterance();
  return {dom: doc.outerHTML, fields: JSON.stringify(fields), focus: a ? path(a) : null,
          selection: JSON.stringify([range, String(window.getSelection() || '')]),
          scroll: JSON.stringify([scrollX, scrollY, scrolled]),
          task: JSON.stringify({done: !!WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
                                reason: typeof WOB_REWARD_REASON === 'undefined' ? null : WOB_REWARD_REASON,
                                utterance: (u && typeof u === 'object') ? u : String(u)})};
})()"""


def score_of(raw_reward: float, done: bool) -> float:
    """MiniWoB++ rewards are -1 (wrong) .. 1 (right), 0 while not done; the gym scores clip(raw, 0, 1)."""
    return max(0.0, min(1.0, float(raw_reward))) if done else 0.0


class MiniwobSuite:
    """Starts a seeded episode in an execution's browser and reads the page's reward at evaluate time."""

    kind = "miniwob"

    def __init__(self, tasks: MiniwobTaskSet | None = None, time_limit_s: float = 3600.0) -> None:
        if not 1 <= time_limit_s <= MAX_TIME_LIMIT_S:
            raise ValueError(f"miniwob time limit must be within 1..{MAX_TIME_LIMIT_S} s, got {time_limit_s}")
        self.tasks = tasks or load_miniwob_tasks()
        self.time_limit_s = time_limit_s

    async def begin(self, ex, seed: int | None) -> dict:
        """Load the page if the spare shows another one, start the seeded episode, settle the screen.
        Returns the create reply's extra fields: the seed, the concrete instruction and the instance."""
        desk: BrowserDesktop = ex.desktop
        task: MiniwobTask = ex.task
        seed = secrets.randbelow(2 ** 31) if seed is None else seed
        t0 = time.monotonic()
        if desk.loaded_page != task.page:
            await asyncio.to_thread(desk.navigate, task.page, _PAGE_READY_JS)
        # The pointer starts in the top-left corner, over the utterance (where Selenium's starts in the package's
        # environment): the first screen never depends on what it happened to hover before (the centre of a new
        # X screen, or where the last episode of a reused browser left it), nor on when the hover repaints.
        await asyncio.to_thread(desk.xinput.move, 0, 0)
        before = await self._screen_shows_the_page(desk)   # the START cover: the episode's first frame differs from it
        token = secrets.token_hex(8)
        started = await desk.aevaluate(_BEGIN_JS % {"limit_ms": int(self.time_limit_s * 1000), "seed": int(seed),
                                                    "token": json.dumps(token), "utterance": _UTTERANCE_JS})
        instance = await self._wait_ready(desk, started)
        await asyncio.gather(
            # Back/forward could leave the task page; the history before this episode is dropped.
            desk.cdp.acall("Page.resetNavigationHistory", session=desk.session),
            # The window has the X focus, but Chromium only gives the page keyboard focus once it is activated
            # (a first click would otherwise be spent on that, racing the keys typed right after it).
            desk.cdp.acall("Page.bringToFront", session=desk.session))
        desk.screen.prepare(await self._settle_first_frame(desk, before, started["covered"]),
                            *ex.state.get("shot_format", ("png", 85)))
        ex.state["miniwob"] = {"seed": seed, "token": token, "started": time.monotonic(), **instance}
        logger.debug("miniwob %s seed %d ready in %.0f ms: %s", task.name, seed, (time.monotonic() - t0) * 1e3,
                     instance["utterance"])
        return {"seed": seed, "instruction": instance["utterance"],
                "instance": {"seed": seed, "utterance": instance["utterance"], "fields": instance["fields"],
                             "time_limit_s": self.time_limit_s}}

    @staticmethod
    async def _screen_shows_the_page(desk: BrowserDesktop) -> bytearray:
        """The screen once it shows the document as it is now (``Screen.arm_and_grab``: X DAMAGE armed). A page
        loaded again for a reused browser (``recycle``) may not have reached the X server yet when the next
        episode starts: the screen still showed the last episode's, the START cover came after the grab and was
        taken for the episode's first frame (a CI run's first screen differed from a new browser's). So after a load
        (``loaded_unseen``) the page paints first (two animation frames, ``painted``) and the screen settles; a page
        restarted in place has shown its DONE cover since the last episode's end."""
        if desk.loaded_unseen:
            shown = desk.screen.arm_and_grab()
            await desk.painted()
            await settle(desk.screen, shown, PAINT_SETTLE_S, max_s=1.0)
            desk.loaded_unseen = False
        return desk.screen.arm_and_grab()

    @staticmethod
    async def _settle_first_frame(desk: BrowserDesktop, before: bytearray, covered: bool) -> bytearray:
        """The episode's first screen, settled as after an action (X DAMAGE: no polling; at most 1 s for pages that
        never stop moving). When the screen showed the cover, until it shows something else (Chromium may redraw
        a frame unchanged first)."""
        deadline = time.monotonic() + (BEGIN_FIRST_FRAME_S if covered else BEGIN_CHANGE_WAIT_S)
        while True:
            changed, frame = await settle(desk.screen, before, max(0.0, deadline - time.monotonic()), max_s=1.0)
            if changed or not covered or time.monotonic() >= deadline:
                return frame

    async def _wait_ready(self, desk: BrowserDesktop, state: dict, timeout_s: float = 5.0) -> dict:
        """Some pages build their problem asynchronously (``WOB_TASK_READY``); the package waits for it too.
        ``state``: the page's answer right after the start (``_UTTERANCE_JS``)."""
        deadline = time.monotonic() + timeout_s
        while not state["ready"] and time.monotonic() <= deadline:
            await asyncio.sleep(0.01)
            state = await desk.aevaluate(_UTTERANCE_JS)
        return {"utterance": state["utterance"], "fields": state["fields"]}

    def fork_refusal(self, task: MiniwobTask) -> str | None:
        note = task.fork_note
        return None if note is None else f"task {task.task_id} is not forkable: {note}"

    async def fork_state(self, ex) -> dict:
        """The page's task state (``_FORK_STATE_JS``), which a fork's children must share with their parent."""
        return await ex.desktop.aevaluate(_FORK_STATE_JS)

    def volatile(self, task: MiniwobTask, width: int, height: int) -> list[list[int]]:
        """No page of the package draws on its own outside the time-dependent ones, which are not forkable."""
        return []

    async def evaluate(self, ex, body: dict) -> dict:
        """The genv evaluate reply, from the page's own reward variables."""
        info = ex.state.get("miniwob", {})
        details = {"seed": info.get("seed"), "utterance": info.get("utterance"),
                   "time_limit_s": self.time_limit_s,
                   "elapsed_s": round(time.monotonic() - info["started"], 3) if "started" in info else None}
        try:
            state = await ex.desktop.aevaluate(_STATE_JS)
        except CDPError as exc:
            state, details["error"] = None, str(exc)
        if state is None or state.get("token") != info.get("token"):
            details.update(done=False, raw_reward=None, env_reward=None, reason=None)
            message = "the task page was reloaded or left: this episode is lost"
            return _reply(0.0, False, message, details)
        done, raw = state["done"], float(state["raw_reward"] or 0.0)
        details.update(done=done, raw_reward=raw, env_reward=float(state["env_reward"] or 0.0),
                       reason=state["reason"])
        score = score_of(raw, done)
        if not done:
            message = "the episode has not ended (the task was not completed or submitted)"
        else:
            message = f"the page ended the episode with raw reward {raw:g}" + (
                f" ({state['reason']})" if state["reason"] else "")
        return _reply(score, done and raw >= 1.0, message, details)


def _reply(score: float, success: bool, message: str, details: dict) -> dict:
    validator = {"id": "miniwob_reward", "pass": success, "score": score, "weight": 1.0, "message": message}
    return {"success": success, "score": score,
            "result": {"score": score, "success": success, "validators": [validator], "miniwob": details}}
