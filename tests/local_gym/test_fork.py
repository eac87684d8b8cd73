"""Forks of live X11 desktops by replay (docs/local_gym.md, "Forks"; fork.py), through the genv API and
``GenvClient.fork``: children equal to the parent at the fork (screenshots byte for byte, HOME files) and to each
other; each goes its own way (an action on one changes neither the parent nor a sibling); the parent is untouched;
a task marked not forkable, and replays that do not reach the parent's state, are a 409 that leaves no child
behind; a declared volatile region is the mask; nothing runs on after terminate, nor after a fork the gym's
shutdown cut short. MiniWoB++ pages: test_fork_miniwob.py; VMs: test_vm_gym.py."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from cua_rl.genv import GenvClient, GenvError
from cua_rl.local_gym import GymError, GymOptions, LocalGym, curriculum, start_gym_server
from cua_rl.local_gym.fork import home_state
from gym_helpers import names, nest_folders, remove_nested
from tests.hosts import alive, descendants, wait_gone

pytestmark = pytest.mark.desktop

DESKTOP_PROCESSES = {"Xvfb", "openbox", "bwrap", "wish", "xterm", "mousepad", "pcmanfm", "dbus-daemon", "sh"}


def _desktop_pids() -> set[int]:
    """The desktop processes below this test process (its gyms run in-process)."""
    return {pid for pid, name in names(descendants([os.getpid()])).items() if name in DESKTOP_PROCESSES}


def _xterm_task(number: str, command: str, **extra) -> dict:
    """An inline task: a terminal whose shell first runs ``command``."""
    return {"number": number, "name": f"term-{number}", "category": "terminal", "difficulty": "easy",
            "instruction": "Write hi into hi.txt.",
            "setup": {"apps": [{"app": "xterm", "args": ["-e", "sh", "-c", f"{command}\nexec sh"]}]},
            "validators": [{"id": "hi", "type": "file_exists", "path": "hi.txt"}],
            "solution": [{"type": "type", "text": "echo hi > hi.txt\n"}], **extra}


async def test_children_equal_the_parent_and_each_other_then_each_goes_its_own_way():
    seed = 11
    keys = curriculum.make_instance("key-sequence", seed).solution     # three key presses solve it
    with start_gym_server(port=0, pool_size=3, max_spares=3, x_spares=0, max_executions=6,
                          prewarm=["054"]) as gym:
        async with GenvClient(gym.url, gym.gym_id) as c:
            eid = (await c.create_execution("054", {"seed": seed})).execution_id
            for action in keys[:2]:
                assert (await c.act(eid, action))["ok"]
            desks = gym.manager.executions
            parent_frame = bytes(desks[eid].desktop.screen.grab())
            before = await c.screenshot(eid)

            fork = await c.fork(eid, 3)
            kids = [e.execution_id for e in fork.executions]
            assert len(set(kids)) == 3 and eid not in kids and fork.mask == ()
            assert all(e.seed == seed and e.task_id == "054-key-sequence" for e in fork.executions)
            assert fork.raw["mechanism"] == "replay" and fork.raw["actions"] == 2
            assert [await c.screenshot(k) for k in kids] == [before] * 3, "a child's screenshot is not the parent's"
            assert all(bytes(desks[k].desktop.screen.grab()) == parent_frame for k in kids)
            homes = [home_state(desks[x].desktop.home) for x in (eid, *kids)]
            assert homes[0] and all(h == homes[0] for h in homes), "a child's files are not the parent's"
            status = await c.get_execution(kids[0])
            assert status["forked_from"] == eid and status["actions"] == 2
            assert await c.screenshot(eid) == before, "the fork changed the parent"

            # each goes its own way: the last key solves child 0 only
            assert (await c.act(kids[0], keys[2]))["ok"]
            scores = {x: (await c.evaluate(x)).reward for x in (eid, *kids)}
            assert scores == {eid: 0.0, kids[0]: 1.0, kids[1]: 0.0, kids[2]: 0.0}
            assert await c.screenshot(kids[0]) != before
            assert await c.screenshot(eid) == before and await c.screenshot(kids[1]) == before
            # ... and the parent goes on as if nothing happened: a wrong key loses it, its children keep theirs
            wrong = "r" if keys[2]["keys"] != ["r"] else "g"
            assert (await c.act(eid, {"type": "key", "keys": [wrong]}))["ok"]
            assert await c.screenshot(eid) != before and await c.screenshot(kids[1]) == before
            assert (await c.act(kids[1], keys[2]))["ok"] and (await c.evaluate(kids[1])).reward == 1.0

            # a child forks in turn: its children replay the whole history (the parent's two keys and its own)
            grandchild = (await c.fork(kids[0], 1)).executions[0].execution_id
            assert await c.screenshot(grandchild) == await c.screenshot(kids[0])
            assert (await c.evaluate(grandchild)).reward == 1.0

            # refusals change nothing: a bad count, an unknown execution, more children than the cap allows
            for body in ({"count": 0}, {"count": "2"}, {"count": 2, "depth": 1}):
                r = await c._http.post(c._url("executions", eid, "fork"), json=body)
                assert r.status_code == 422, (body, r.text)
            with pytest.raises(GenvError) as err:
                await c.fork("no-such-execution", 1)
            assert err.value.status_code == 404
            with pytest.raises(GenvError) as err:
                await c.fork(eid, 2)                 # 5 running, at most 6
            assert err.value.status_code == 429 and "2 more" in str(err.value)
            assert len(gym.manager.executions) == 5

            pids = descendants([p for x in (eid, *kids, grandchild) for p in desks[x].desktop.pids()])
            assert len(pids) >= 5 * 4     # each: Xvfb, openbox, the sandbox, the board's wish (and more)
            for x in (eid, *kids, grandchild):
                await c.terminate(x)
            assert wait_gone(pids) == set(), "terminate left a parent's or a child's processes behind"


async def test_a_fork_the_task_or_its_replay_cannot_honour_is_a_409_that_leaves_no_child():
    random_screen = _xterm_task("981", "od -An -N8 -tx1 /dev/urandom")           # each desktop shows other bytes
    # same screen, other file; 80 MB of zeros first (issue 80: the state read 64 MiB, then took every file for equal)
    random_file = _xterm_task("982", "head -c 80000000 /dev/zero > a.bin; od -An -N8 -tx1 /dev/urandom > noise.txt")
    opts = GymOptions(gym_id="fork-409", pool_size=0, x_spares=0, extra_tasks=[random_screen, random_file],
                      fork_wait_s=1.0)   # refused after a second of waiting for the parent's screen or files
    async with LocalGym(opts) as gym:
        parent = (await gym.reset("025"))["execution_id"]    # marked forkable: false (trash dates)
        with pytest.raises(GymError) as err:
            await gym.fork(parent, {"count": 2})
        assert err.value.status == 409 and "025-files-trash is not forkable: the trash records" in err.value.detail
        await gym.terminate(parent)
        reasons = {}
        for number in ("981", "982", "deep"):
            if number == "deep":   # issue 80: a HOME 1,100 folders deep was a 503 blaming the desktop
                nest_folders(gym.manager.executions[parent].desktop.home, 1100)
            else:
                parent = (await gym.reset(number))["execution_id"]
                assert (await gym.act(parent, {"type": "type", "text": "echo hi > hi.txt\n"}))["ok"]
            with pytest.raises(GymError) as err:
                await gym.fork(parent, {"count": 1})
            assert err.value.status == 409, err.value.detail
            reasons[number] = err.value.detail
            assert list(gym.manager.executions) == [parent], "a refused fork left a child running"
            assert {name for name in names(_desktop_pids()).values()} >= {"Xvfb", "xterm"}
            assert sum(1 for n in names(_desktop_pids()).values() if n == "Xvfb") == 1   # the parent's only
            if number == "deep":   # a HOME not on a tmpfs (a gym not root) is removed by shutil.rmtree: it recurses
                remove_nested(gym.manager.executions[parent].desktop.home)
            if number != "982":    # its HOME gets deep next
                await gym.terminate(parent)
    assert reasons["981"].startswith("after replaying 1 actions (it never showed the parent's screen before action "
                                     "1) the child's screen is not the parent's at the fork: "), reasons
    assert reasons["982"].startswith("after replaying 1 actions the child's screen is the parent's but its task "
                                     "state is not: noise.txt: differs"), reasons
    assert reasons["deep"].startswith("the parent's HOME is more than 64 folders deep (at 'd/d/d/"), reasons


async def test_a_declared_volatile_region_is_the_mask_and_only_there_may_children_differ():
    # One writer on the terminal (no echo, no shell): a clock at row 1, column 60, redrawn every 0.2 s, and the keys
    # typed so far (kept in typed.txt) on row 2; the cursor parked on row 3. A key is kept whatever read's status:
    # one read just as its 0.2 s ran out is in k with the time-out's status (bash: "saves any partial input").
    script = ("stty -echo; while :; do printf '\\033[1;60H%s\\033[3;1H' \"$(date +%N)\"; "
              "IFS= read -r -s -t 0.2 -n 1 k; [ -n \"$k\" ] && printf %s \"$k\" >> typed.txt && "
              "printf '\\033[2;1H%s\\033[3;1H' \"$(cat typed.txt)\"; done")

    def clock_task(number: str, **extra) -> dict:
        return {"number": number, "name": f"clock-{number}", "category": "terminal", "difficulty": "easy",
                "instruction": "Type hi.", "setup": {"apps": [{"app": "xterm", "args": ["-e", "bash", "-c", script]}]},
                "validators": [{"id": "hi", "type": "file_equals", "path": "typed.txt", "text": "hi"}],
                "solution": [{"type": "type", "text": "hi"}], **extra}

    region = [0.5, 0.02, 0.6, 0.06]    # around the clock
    # the gym's default wait for a child's screen (5 s); the control's refusal waits it out
    opts = GymOptions(gym_id="fork-mask", pool_size=0, x_spares=0,
                      extra_tasks=[clock_task("983", volatile=[region]), clock_task("984")])
    async with LocalGym(opts) as gym:
        parent = (await gym.reset("983"))["execution_id"]
        assert (await gym.act(parent, {"type": "type", "text": "hi"}))["ok"]
        fork = await gym.fork(parent, {"count": 2})
        assert fork["mask"] == [[640, 16, 768, 48]]
        (x0, y0, x1, y1), = fork["mask"]
        kids = [c["id"] for c in fork["executions"]]
        screens = [gym.manager.executions[x].desktop.screen for x in (parent, *kids)]
        frames = [s.image(s.grab()) for s in screens]
        for frame in frames:
            frame.paste((0, 0, 0), (x0, y0, x1, y1))
        assert all(f.tobytes() == frames[0].tobytes() for f in frames), "children differ outside the mask"
        for x in (parent, *kids):
            assert (await gym.evaluate(x))["score"] == 1.0
            await gym.terminate(x)
        # the control: the same clock without the region declared is a refused fork, not a wrong one
        parent = (await gym.reset("984"))["execution_id"]
        with pytest.raises(GymError) as err:
            await gym.fork(parent, {"count": 1})
        assert err.value.status == 409 and "pixels differ, within [6" in err.value.detail, err.value.detail


async def test_a_parent_still_drawing_at_the_fork_is_compared_as_it_ends():
    # An act settles at the first 12 ms of quiet, so a fork may find its parent half-drawn (CI, sessions 34-36: a
    # loaded machine's terminal drew the second typed key a fork-and-exec late, and children that reached the
    # parent's state were refused: "55 pixels differ, within [14, 46, 23, 60]", that key). Here the parent shows
    # "h" at the fork and "hi" a second later (a file in its .cache, which no task state holds, slows it), while a
    # child draws "hi" in one go: it is held to where the parent ends, not to the frame the fork found.
    script = ("stty -echo; while :; do IFS= read -r -s -n 1 k; keys=$keys$k; if [ ! -e .cache/slow ]; then "
              "while IFS= read -r -s -t 0.05 -n 1 k; do keys=$keys$k; done; fi; printf %s \"$keys\" > typed.txt; "
              "printf '\\r%s' \"$keys\"; [ -e .cache/slow ] && sleep 1; done")
    task = {"number": "985", "name": "slow-985", "category": "terminal", "difficulty": "easy",
            "instruction": "Type hi.", "setup": {"apps": [{"app": "xterm", "args": ["-e", "bash", "-c", script]}]},
            "validators": [{"id": "hi", "type": "file_equals", "path": "typed.txt", "text": "hi"}],
            "solution": [{"type": "type", "text": "hi"}]}
    async with LocalGym(GymOptions(gym_id="fork-drawing", pool_size=0, x_spares=0, extra_tasks=[task])) as gym:
        parent = (await gym.reset("985"))["execution_id"]
        desk = gym.manager.executions[parent].desktop
        (desk.home / ".cache").mkdir(exist_ok=True)
        (desk.home / ".cache" / "slow").write_text("")
        assert (await gym.act(parent, {"type": "type", "text": "hi"}))["ok"]
        typed = desk.home / "typed.txt"
        for _ in range(100):    # the act may settle before the terminal took the first key
            if typed.exists() and typed.read_text():
                break
            await asyncio.sleep(0.05)
        assert typed.read_text() == "h", "the parent did not show 'h' alone when forked"
        fork = await gym.fork(parent, {"count": 1})
        kid = fork["executions"][0]["id"]
        frames = [bytes(gym.manager.executions[x].desktop.screen.grab()) for x in (parent, kid)]
        assert frames[0] == frames[1], "the child is not the parent at the end of the fork"
        for x in (parent, kid):
            assert (await gym.evaluate(x))["score"] == 1.0
            await gym.terminate(x)


async def test_a_fork_cut_short_by_the_gym_shutting_down_leaves_nothing_running():
    keys = curriculum.make_instance("key-sequence", 5).solution
    gym = await LocalGym(GymOptions(gym_id="fork-close", pool_size=0, x_spares=0)).start()
    try:
        parent = (await gym.reset("054", {"options": {"seed": 5}}))["execution_id"]
        for action in keys[:2]:
            await gym.act(parent, action)
        fork = asyncio.create_task(gym.fork(parent, {"count": 3}))
        await asyncio.sleep(0.3)                  # the children are being made
        seen = _desktop_pids()
    finally:
        await gym.close()
    result = (await asyncio.gather(fork, return_exceptions=True))[0]
    # the fork either finished before the shutdown reached its children (which the shutdown then ended) or was
    # refused as the gym is shutting down: never a child left running
    assert not isinstance(result, GymError) or result.status == 429 and "shutting down" in result.detail, result
    assert gym.manager.executions == {}
    assert wait_gone(seen | _desktop_pids()) == set(), "a fork's child outlived the gym"


async def _hang_up_during(url: str, path: str, body: bytes, working) -> None:
    """POST ``body`` to ``path`` on a raw socket, and close it once ``working()`` says the gym is at it: a client
    gone before the answer (a trainer killed, a request timed out)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    deadline = time.monotonic() + 10
    while not working():
        assert time.monotonic() < deadline, "the gym never started on the request"
        await asyncio.sleep(0.005)
    with pytest.raises(asyncio.TimeoutError):   # no answer yet
        await asyncio.wait_for(reader.read(1), 0.01)
    writer.close()
    await writer.wait_closed()


async def _settled(manager, keep: set[int], timeout_s: float = 15.0) -> None:
    """Wait until the gym holds no more than ``keep``'s desktops: nothing being created, ended or built in the
    background (a build a cancelled create left runs on, then is destroyed), no other desktop process alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = manager.states()
        extra = alive(_desktop_pids()) - keep
        if not (states["creating"] or states["terminating"] or manager._tasks or extra):
            return
        assert time.monotonic() < deadline, (f"still running after the client hung up: executions "
                                             f"{list(manager.executions)}, {states}, processes {names(extra)}")
        await asyncio.sleep(0.05)


async def test_a_create_or_a_fork_whose_client_hung_up_ends_what_it_made():
    """Issue 80: a fork whose client went away left its children running, ids unknown to anyone, until the idle
    reaper (30 min); a create the same. Each request is watched for its client's hang-up and cancelled then, and
    a cancelled create or fork ends what it made."""
    seed = 5
    keys = curriculum.make_instance("key-sequence", seed).solution
    with start_gym_server(port=0, pool_size=0, x_spares=0, max_executions=4) as gym:
        m = gym.manager
        base = f"/api/v1/{gym.gym_id}"
        await _hang_up_during(gym.url, f"{base}/tasks/054", b'{"options": {"seed": 5}}',
                              lambda: m.states()["creating"] > 0)
        await _settled(m, set())
        assert m.executions == {}, "a create whose client hung up left its execution"
        async with GenvClient(gym.url, gym.gym_id) as c:
            parent = (await c.create_execution("054", {"seed": seed})).execution_id
            for action in keys[:2]:
                assert (await c.act(parent, action))["ok"]
            mine = alive(_desktop_pids())
            await _hang_up_during(gym.url, f"{base}/executions/{parent}/fork", b'{"count": 2}',
                                  lambda: m.states()["creating"] > 0)
            await _settled(m, mine)
            assert list(m.executions) == [parent], "a fork whose client hung up left children"
            assert (await c._http.get(f"{gym.url}/health")).json()["executions"] == 1
            assert (await c.act(parent, keys[2]))["ok"] and (await c.evaluate(parent)).reward == 1.0
            await c.terminate(parent)
        assert wait_gone(mine) == set()

