"""The MiniWoB++ suite without desktops: the task catalogue read from the installed package, the
create-execution body, the reward mapping, option defaults, the DevTools pipe framing, workflow seeds."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from cua_rl.local_gym.browser import BrowserSpec
from cua_rl.local_gym.cdp import CDPError, CDPPipe
from cua_rl.local_gym.manager import GymOptions, pool_key
from cua_rl.local_gym.miniwob import (
    CATEGORIES,
    MiniwobSuite,
    category_of,
    difficulty_of,
    load_miniwob_tasks,
    package_dir,
    score_of,
)
from cua_rl.local_gym.suite import MAX_SEED, OptionsError, create_options

REPO = Path(__file__).resolve().parents[2]


def test_every_package_page_is_a_task_with_category_and_difficulty():
    tasks = load_miniwob_tasks()
    pages = sorted(p.stem for p in (package_dir() / "html" / "miniwob").glob("*.html"))
    assert [t.name for t in sorted(tasks.tasks, key=lambda t: t.name)] == pages and len(pages) == 130
    assert {t.category for t in tasks.tasks} == set(CATEGORIES)
    assert {t.difficulty for t in tasks.tasks} == {"easy", "normal", "hard"}
    assert tasks.get("click-button") is tasks.get(tasks.get("click-button").number)
    wire = tasks.get("enter-text").to_wire()
    assert wire["tags"][:3] == ["easy", "form", "miniwob"] and wire["examples"]
    assert "unregistered" in tasks.get("chase-circle").flags            # not a gym env in the package
    assert "partial_reward" in tasks.get("click-checkboxes-soft").flags


def test_categories_and_difficulty_rules():
    assert category_of("click-tab-2-hard") == "click" and category_of("email-inbox-nl-turk") == "web_app"
    assert category_of("book-flight-nodelay") == "web_app" and category_of("simple-algebra") == "reasoning"
    assert difficulty_of("click-tab-2-medium", 10_000) == "normal" and difficulty_of("choose-date-easy", 30_000) == "easy"
    assert [difficulty_of("x", ms) for ms in (7_000, 15_000, 30_000)] == ["easy", "normal", "hard"]


def test_no_package_file_is_copied_into_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    names = {Path(p).name for p in tracked}
    pages = {p.name for p in (package_dir() / "html").rglob("*") if p.is_file()}
    assert not names & pages, sorted(names & pages)[:10]


@pytest.mark.parametrize("body, seed", [(None, None), ({}, None), ({"options": {}}, None),
                                        ({"options": {"seed": 0}}, 0), ({"options": {"seed": MAX_SEED}}, MAX_SEED),
                                        ({"options": {"seed": 5, "other": "kept for other gyms"}}, 5)])
def test_good_create_bodies(body, seed):
    assert create_options(body) == seed


@pytest.mark.parametrize("body", [[], "7", {"options": []}, {"options": {"seed": "7"}}, {"options": {"seed": -1}},
                                  {"options": {"seed": 2.0}}, {"options": {"seed": False}},
                                  {"options": {"seed": MAX_SEED + 1}}])
def test_bad_create_bodies(body):
    with pytest.raises(OptionsError):
        create_options(body)


def test_reward_mapping():
    assert score_of(1.0, True) == 1.0 and score_of(-1.0, True) == 0.0 and score_of(0.4, True) == 0.4
    assert score_of(1.0, False) == 0.0 and score_of(-0.5, True) == 0.0


def test_options_by_suite():
    mw = GymOptions(gym_id="miniwob")
    assert (mw.suite, mw.width, mw.height, mw.pool_size) == ("miniwob", 480, 630, 4)
    desk = GymOptions()
    assert (desk.suite, desk.width, desk.height, desk.pool_size) == ("desktop", 1280, 800, 1)
    assert GymOptions(gym_id="web", suite="miniwob", width=320, pool_size=0).width == 320
    with pytest.raises(ValueError):
        GymOptions(suite="android")
    # MiniWoB++ by default: a browser serves 50 episodes, each after the first restarted in its page
    assert (mw.reuse_browsers, mw.restart_in_page) == (50, True)
    assert (desk.reuse_browsers, desk.restart_in_page) == (0, False)
    assert GymOptions(gym_id="miniwob", reuse_browsers=0).restart_in_page is False     # the opt-out: new browsers
    assert GymOptions(gym_id="miniwob", restart_in_page=False).reuse_browsers == 50    # reused, page loaded again
    with pytest.raises(ValueError, match="reuse_browsers"):
        GymOptions(gym_id="miniwob", reuse_browsers=1, restart_in_page=True)   # restarts in a reused browser: none
    with pytest.raises(ValueError, match="reuse_browsers"):
        GymOptions(restart_in_page=True)                                       # app desktops are never reused
    assert GymOptions(gym_id="miniwob", reuse_browsers=2, restart_in_page=True).restart_in_page
    with pytest.raises(ValueError):
        MiniwobSuite(load_miniwob_tasks(), time_limit_s=3e6)   # beyond what setTimeout can hold


def test_browser_specs_share_spares_across_pages():
    tasks = load_miniwob_tasks()
    a, b = (tasks.get(n).desktop_spec(480, 630) for n in ("click-test", "enter-text"))
    assert isinstance(a, BrowserSpec) and a.zoom == 3 and a != b and pool_key(a) == pool_key(b)
    assert a.url() == "http://gym.test/miniwob/click-test.html"


def test_a_reused_browser_is_picked_by_the_page_it_shows(tmp_path):
    """Spares are picked by the page they show now: a reused browser's spec still names the page it was built with.
    (Picked by that spec, a browser showing another page was taken and loaded a page again while one showing it
    waited, 9 page loads in 24 bench episodes instead of 3.) With none showing it, one whose page another spare
    shows too is taken before the oldest. Stand-ins for the spares: only their spec and page are read."""
    import asyncio
    from types import SimpleNamespace

    from cua_rl.local_gym.manager import GymManager

    tasks = load_miniwob_tasks()
    spec = {n: tasks.get(n).desktop_spec(480, 630) for n in ("click-button", "login-user", "enter-text", "click-test")}
    manager = GymManager(GymOptions(gym_id="miniwob", x_spares=0, workdir=str(tmp_path)))
    try:
        shows = ["click-button", "login-user", "login-user", "login-user", "enter-text"]   # all built for login-user
        manager._spares[pool_key(spec["login-user"])].extend(
            SimpleNamespace(spec=spec["login-user"], loaded_page=spec[name].page, name=i) for i, name in enumerate(shows))
        assert manager._take_spare(spec["login-user"]).name == 1         # not 0, built for it but showing another
        assert manager._take_spare(spec["click-test"]).name == 2         # login-user is shown twice: one can go
        assert manager._take_spare(spec["click-button"]).name == 0
        assert manager._take_spare(spec["click-test"]).name == 3         # none shown twice: the oldest
    finally:
        manager._spares.clear()
        asyncio.run(manager.close())


def test_devtools_pipe_framing_errors_and_eof():
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    pipe = CDPPipe(to_w, from_r, name="test")
    events = []
    pipe.on("Some.event", lambda params, session: events.append((params, session)))

    def browser():  # answers like Chromium: NUL-terminated JSON, replies by id, one event, one error
        buf = b""
        while b"\0" not in buf:
            buf += os.read(to_r, 4096)
        msgs = [json.loads(m) for m in buf.split(b"\0") if m]
        out = [{"method": "Some.event", "params": {"a": 1}, "sessionId": "S"},
               {"id": msgs[0]["id"], "result": {"ok": msgs[0]["params"]}}]
        os.write(from_w, b"".join(json.dumps(m).encode() + b"\0" for m in out))
        buf = b""
        while b"\0" not in buf:
            buf += os.read(to_r, 4096)
        os.write(from_w, json.dumps({"id": json.loads(buf.split(b"\0")[0])["id"],
                                     "error": {"message": "nope"}}).encode() + b"\0")

    peer = threading.Thread(target=browser)
    peer.start()
    assert pipe.call("A.b", {"x": 1}) == {"ok": {"x": 1}}
    with pytest.raises(CDPError, match="nope"):
        pipe.call("A.c")
    peer.join()
    assert events == [({"a": 1}, "S")]
    pending = pipe.send("A.d")
    os.close(from_w)                    # the browser exits: what is pending fails, nothing hangs
    with pytest.raises(CDPError, match="exited"):
        pending.result(5)
    pipe.close(join_s=5)
    os.close(to_r)
