"""The gym's HTTP contract through the genv client, on real desktops: shapes, errors, lifecycle."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import time

import httpx
import pytest
from PIL import Image

from cua_rl.genv import GenvClient, GenvError
from cua_rl.local_gym import load_tasks, start_gym_server
from cua_rl.local_gym.keyboard_suite import write_suite
from cua_rl.local_gym.procs import wait_until
from gym_helpers import evaluation_within, names
from tests.hosts import descendants, stop, wait_gone, wait_http

pytestmark = pytest.mark.desktop
EDITOR_TASK = "001"   # mousepad on notes.txt; its solution types and saves


def desktop_pids(gym, execution_id: str) -> set[int]:
    return descendants(gym.manager.executions[execution_id].desktop.pids())


async def test_tasks_and_execution_contract(gym):
    async with GenvClient(gym.url, gym.gym_id) as c:
        tasks = await c.list_tasks()
        assert len(tasks) >= 40
        task = await c.get_task("001")
        assert task.id == tasks[0].id and task.instruction and task.difficulty in ("easy", "normal", "hard")
        with pytest.raises(GenvError) as err:
            await c.get_task("999")
        assert err.value.status_code == 404 and "999" in err.value.detail

        async with c.execution(EDITOR_TASK) as ex:
            assert isinstance(ex.execution_id, str) and ex.execution_id
            status = await c.get_execution(ex.execution_id)
            assert status["execution_id"] == ex.execution_id and status["status"] == "running"
            assert status["task_id"] == task.id and status["screen"] == {"width": 1280, "height": 800}

            png = await c.screenshot(ex.execution_id)
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(png)).size == (1280, 800)
            for _ in range(4):  # a still desktop is one picture: the editor's caret does not blink
                await asyncio.sleep(0.4)
                assert await c.screenshot(ex.execution_id) == png
            jpeg = await c.screenshot(ex.execution_id, format="jpeg")
            assert jpeg[:2] == b"\xff\xd8" and Image.open(io.BytesIO(jpeg)).size == (1280, 800)

            first = await c.evaluate(ex.execution_id)
            raw = first.raw
            assert raw["success"] is False and 0 <= raw["result"]["score"] < 1
            for v in raw["result"]["validators"]:
                assert {"id", "pass", "score", "weight"} <= set(v)
            assert first.reward == pytest.approx(raw["result"]["score"])

            reply = await c.act(ex.execution_id, {"type": "key", "keys": ["ctrl", "end"]})
            assert reply["ok"] is True and "screen_changed" in reply
            reply = await c.act(ex.execution_id, {"type": "type", "text": "Buy milk"})
            assert reply == {"ok": True, "screen_changed": True}
            assert await c.screenshot(ex.execution_id) != png
            await c.act(ex.execution_id, {"type": "key", "keys": ["ctrl", "s"]})
            done = await c.evaluate(ex.execution_id)
            assert done.reward == 1.0 and done.success is True
            pids = desktop_pids(gym, ex.execution_id)
            assert len(pids) >= 5  # Xvfb, openbox, bwrap (x2), dbus, the editor

        assert wait_gone(pids) == set(), "terminate left desktop processes behind"
        for call in (c.get_execution(ex.execution_id), c.terminate(ex.execution_id),
                     c.act(ex.execution_id, {"type": "wait", "ms": 1})):
            with pytest.raises(GenvError) as err:
                await call
            assert err.value.status_code == 404


async def test_bad_input_is_rejected_and_desktop_stays_usable(gym):
    async with GenvClient(gym.url, gym.gym_id) as c:
        with pytest.raises(GenvError) as err:
            await c.create_execution("no-such-task")
        assert err.value.status_code == 404
        async with c.execution(EDITOR_TASK) as ex:
            eid = ex.execution_id
            cases = [({"type": "click", "x": 1.2, "y": 0.5}, 422, "outside the screen"),
                     ({"type": "click", "x": 0.5}, 422, "missing y"),
                     ({"type": "jump"}, 422, "unknown action type"),
                     ({"type": "key", "keys": ["ctrl", "bogus"]}, 422, "unknown key"),
                     ({"type": "type", "text": "x" * 10_000}, 413, "at most")]
            for action, status, words in cases:
                with pytest.raises(GenvError) as err:
                    await c.act(eid, action)
                assert err.value.status_code == status and words in err.value.detail, (action, err.value)
            async with httpx.AsyncClient() as h:  # not JSON at all
                r = await h.post(f"{gym.url}/api/v1/{gym.gym_id}/executions/{eid}/actions", content=b"{nope",
                                 headers={"Content-Type": "application/json"})
                assert r.status_code == 422 and "JSON" in r.json()["detail"]
                r = await h.get(f"{gym.url}/api/v1/{gym.gym_id}/executions/{eid}/screenshot?format=gif")
                assert r.status_code == 422
                r = await h.get(f"{gym.url}/api/v1/other-gym/tasks")
                assert r.status_code == 404 and "unknown gym" in r.json()["detail"]
            # nothing above touched the desktop: the task is still solvable, and only our text lands
            await c.act(eid, {"type": "key", "keys": ["ctrl", "end"]})
            await c.act(eid, {"type": "type", "text": "Buy milk"})
            await c.act(eid, {"type": "key", "keys": ["ctrl", "s"]})
            assert (await c.evaluate(eid)).reward == 1.0
        with pytest.raises(GenvError) as err:
            await c.get_execution("0" * 32)
        assert err.value.status_code == 404


async def test_cap_pool_reaper_and_shutdown():
    """Separate small server: concurrency cap (429), warm pool, TTL reaper, shutdown ends every desktop."""
    # the TTL is long while the cap is checked (a cold create under load takes seconds, and the warm execution
    # made before it must not be reaped meanwhile), then short for the reaper's part
    server = start_gym_server(port=0, max_executions=2, pool_size=1, max_spares=1, prewarm=["012"],
                              ttl_s=600, reap_interval_s=0.2)
    all_pids: set[int] = set()
    try:
        async with GenvClient(server.url, server.gym_id) as c:
            deadline = time.monotonic() + 30
            while server.manager.pool_stats()["spares"] < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            warm = await c.create_execution("012")
            assert warm.raw["warm"] is True
            all_pids |= desktop_pids(server, warm.execution_id)   # before its TTL can pass
            cold = await c.create_execution("001")
            assert cold.raw["warm"] is False
            all_pids |= desktop_pids(server, cold.execution_id)
            with pytest.raises(GenvError) as err:
                await c.create_execution("001")
            assert err.value.status_code == 429 and "concurrency cap" in err.value.detail

            # keep one alive with activity, let the other go idle past its TTL
            server.manager.opt.ttl_s = 1.5
            await c.get_execution(warm.execution_id)   # its idle time starts now
            for _ in range(12):
                await c.get_execution(cold.execution_id)
                await asyncio.sleep(0.25)
            with pytest.raises(GenvError) as err:
                await c.get_execution(warm.execution_id)
            assert err.value.status_code == 404
            await c.get_execution(cold.execution_id)
            deadline = time.monotonic() + 30
            while server.manager.pool_stats()["spares"] < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for dq in server.manager._spares.values():
                for desk in dq:
                    all_pids |= descendants(desk.pids())
    finally:
        server.stop()
    assert all_pids and wait_gone(all_pids) == set(), "shutdown left desktop processes behind"


async def test_no_x_state_carries_over_to_the_next_execution():
    """Caps Lock left on in one execution must not reach the next one of the same task (warm pool)."""
    server = start_gym_server(port=0, max_executions=2, pool_size=1, max_spares=1, prewarm=[EDITOR_TASK])
    try:
        async with GenvClient(server.url, server.gym_id) as c:
            async with c.execution(EDITOR_TASK) as first:
                await c.act(first.execution_id, {"type": "key", "keys": ["capslock"]})
                await c.act(first.execution_id, {"type": "type", "text": "shouting"})
                await c.act(first.execution_id, {"type": "key", "keys": ["ctrl", "s"]})
                home = server.manager.executions[first.execution_id].desktop.home
                assert "SHOUTING" in (home / "notes.txt").read_text()  # Caps Lock really was on
            deadline = time.monotonic() + 30
            while server.manager.pool_stats()["spares"] < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            async with c.execution(EDITOR_TASK) as second:
                assert second.raw["warm"] is True
                await c.act(second.execution_id, {"type": "key", "keys": ["ctrl", "end"]})
                await c.act(second.execution_id, {"type": "type", "text": "Buy milk"})
                await c.act(second.execution_id, {"type": "key", "keys": ["ctrl", "s"]})
                assert (await c.evaluate(second.execution_id)).reward == 1.0
    finally:
        server.stop()


async def test_pointer_actions_drag_right_click_scroll(gym):
    """Mouse-only: dragging a file icon onto a folder in the file manager moves it on disk (task 027)."""
    async with GenvClient(gym.url, gym.gym_id) as c:
        async with c.execution("027") as ex:
            eid = ex.execution_id
            # icons in the maximised file manager, sorted: Archive at (206, 118), old-notes.txt at (300, 118)
            reply = await c.act(eid, {"type": "drag", "x": 300 / 1280, "y": 118 / 800,
                                      "x2": 206 / 1280, "y2": 118 / 800})
            assert reply["ok"] is True
            assert (await evaluation_within(c, eid, 5.0)).reward == 1.0
            menu = await c.act(eid, {"type": "click", "x": 0.6, "y": 0.6, "button": "right"})
            assert menu == {"ok": True, "screen_changed": True}       # the context menu opened
            closed = await c.act(eid, {"type": "key", "keys": ["Escape"]})
            assert closed == {"ok": True, "screen_changed": True}
            # a key that draws nothing: the settle wait sees no change (X DAMAGE reports none)
            assert await c.act(eid, {"type": "key", "keys": ["shift"]}) == {"ok": True, "screen_changed": False}
            assert (await c.act(eid, {"type": "scroll", "x": 0.6, "y": 0.6, "dy": 3}))["ok"] is True
            assert (await c.act(eid, {"type": "tap", "x_norm": 0.6, "y_norm": 0.9}))["ok"] is True


async def test_a_drag_onto_a_busy_file_manager_still_drops(gym):
    """The file manager is stopped while the drag's events arrive (a loaded machine), so it reads the press, the
    motions and the release in one batch: the drag must still drop (it waits for the client's answers before
    the release). Without that wait the drop was cancelled every time (0 of 3) and the file stayed put (a CI
    failure of the test above)."""
    async with GenvClient(gym.url, gym.gym_id) as c:
        async with c.execution("027") as ex:
            (manager,) = {pid for pid, name in names(desktop_pids(gym, ex.execution_id)).items() if name == "pcmanfm"}
            loop = asyncio.get_running_loop()
            os.kill(manager, signal.SIGSTOP)
            resume = loop.call_later(0.5, os.kill, manager, signal.SIGCONT)
            try:
                reply = await c.act(ex.execution_id, {"type": "drag", "x": 300 / 1280, "y": 118 / 800,
                                                      "x2": 206 / 1280, "y2": 118 / 800})
            finally:
                resume.cancel()
                os.kill(manager, signal.SIGCONT)
            assert reply["ok"] is True
            assert (await evaluation_within(c, ex.execution_id, 5.0)).reward == 1.0


# Past the name's and the Enter's 1 s pings and the solution's waits before the fix (its second Enter too).
CHOOSER_STOPPED_S = 5.0


async def test_a_save_as_whose_file_chooser_is_stopped_while_the_name_and_enter_arrive_still_saves(tmp_path):
    """The keyboard suite's save-as (keys-filename-21, a CI failure: the dialog kept the typed name, Save greyed)
    with the file chooser's process (mousepad) stopped from before the name until ``CHOOSER_STOPPED_S`` later,
    as a loaded machine may hold it. GTK turns Save sensitive by a timer of its own 150 ms after the name's
    last edit, so a chooser that reads the name and the Enter in one batch finds Save greyed and drops the
    Enter: a policy's right answer scored 0. The gym must hold the Enter until the chooser has taken the name
    and run its timer. Before that, the Enter went out once a ping had waited 1 s: 0.0, the dialog open."""
    write_suite("desktop", tmp_path)
    task = next(t for t in load_tasks(tmp_path).tasks if t.task_id.endswith("keys-filename-21"))
    name_at = task.solution.index({"type": "type", "text": "week.txt"})
    with start_gym_server(port=0, tasks_dir=str(tmp_path), max_executions=1, pool_size=0) as gym:
        async with GenvClient(gym.url, gym.gym_id) as c:
            async with c.execution(task.task_id) as ex:
                for action in task.solution[:name_at]:     # the sentence, ctrl+s, the dialog, its name selected
                    assert (await c.act(ex.execution_id, action))["ok"] is True
                (editor,) = {pid for pid, name in names(desktop_pids(gym, ex.execution_id)).items()
                             if name == "mousepad"}
                os.kill(editor, signal.SIGSTOP)
                resume = asyncio.get_running_loop().call_later(CHOOSER_STOPPED_S, os.kill, editor, signal.SIGCONT)
                try:
                    for action in task.solution[name_at:]:   # the name, a wait, the Enter, a wait
                        assert (await c.act(ex.execution_id, action))["ok"] is True
                finally:
                    resume.cancel()
                    os.kill(editor, signal.SIGCONT)
                saved = await evaluation_within(c, ex.execution_id, 5.0)
                if saved.reward != 1.0:
                    (tmp_path / "screen.png").write_bytes(await c.screenshot(ex.execution_id))
    assert saved.reward == 1.0, f"week.txt not saved (screen: {tmp_path / 'screen.png'}): {saved.raw['result']}"


async def test_a_cold_create_builds_on_a_pre_started_x_server_that_is_then_replaced(caplog):
    """No spare of the profile: the desktop takes a bare X server (never used by a client) and the gym starts
    another; closing the gym ends the bare ones too. (A first attempt that fails is retried on a new X server,
    as it should be, and fails this test: the gym's log of it is in the message. Seen once in CI, session 37:
    mousepad and openbox ran 30 s on the bare server and the window manager listed no mousepad window; the retry
    took 0.3 s. The message now says which windows the X server held.)"""
    caplog.set_level(logging.INFO, logger="cua_rl.local_gym.manager")
    server = start_gym_server(port=0, pool_size=0, max_executions=2, x_spares=1)
    try:
        m = server.manager
        assert await asyncio.to_thread(wait_until, lambda: m.pool_stats()["bare_x"] == 1, 20.0)
        bare = m._bare_x[0]
        xvfb_pid = bare.procs[0].pid
        async with GenvClient(server.url, server.gym_id) as c:
            async with c.execution(EDITOR_TASK) as ex:
                desk = m.executions[ex.execution_id].desktop
                assert (desk.display_num, desk.procs[0].pid) == (bare.display_num, xvfb_pid), \
                    [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
                assert len(await c.screenshot(ex.execution_id)) > 1000   # the apps are on that server
                assert await asyncio.to_thread(wait_until, lambda: m.pool_stats()["bare_x"] == 1, 20.0)
                assert m._bare_x[0].display_num != desk.display_num
                pids = descendants([xvfb_pid, m._bare_x[0].procs[0].pid])
    finally:
        server.stop()
    assert wait_gone(pids) == set()



async def test_a_display_another_gym_on_this_machine_claimed_is_never_taken():
    """Two gyms on one machine pick display numbers from the same base: one that another gym process has
    claimed (its Xvfb not yet listening: the window in which both saw the number free and one desktop failed
    to start, an SFT build's demonstrations lost) is skipped, and the claim is given back when the desktop
    ends. The other gym is a process holding the claim file (``manager.DISPLAY_CLAIMS``) as a gym does."""
    import sys
    import tempfile

    base, claims = 870, os.path.join(tempfile.gettempdir(), "cua-rl-displays")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "os.makedirs(sys.argv[1], mode=0o1777, exist_ok=True)\n"
         "fd = os.open(os.path.join(sys.argv[1], sys.argv[2] + '.lock'), os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n", claims, str(base)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        server = start_gym_server(port=0, pool_size=0, max_executions=1, x_spares=0, display_base=base)
        try:
            m = server.manager
            async with GenvClient(server.url, server.gym_id) as c:
                async with c.execution(EDITOR_TASK) as ex:
                    num = m.executions[ex.execution_id].desktop.display_num
                    assert num != base, f"took :{num}, which another gym had claimed"
                    assert num in m._display_claims
            assert await asyncio.to_thread(wait_until, lambda: num not in m._display_claims, 10.0)
            from cua_rl.local_gym import manager as gym_manager

            assert str(gym_manager.DISPLAY_CLAIMS) == claims   # the holder above stands for a gym
        finally:
            server.stop()
    finally:
        holder.kill()
        holder.wait()


async def test_two_gyms_on_one_machine_never_give_their_desktops_the_same_sandbox_uid():
    """Each slot's uid is claimed machine-wide (``manager.UID_CLAIMS``) while the gym runs: two gyms sharing uids
    had desktops fail to start while both ran (openbox took no map request; docs/notes/ci-ledger.md, "Flakes",
    session 37). A second gym skips the uids the first holds, and a closed gym gives its uids back."""
    from cua_rl.local_gym import manager as gym_manager

    first = start_gym_server(port=0, pool_size=0, max_executions=1, x_spares=0, uid_base=24000)
    try:
        second = start_gym_server(port=0, pool_size=0, max_executions=1, x_spares=0, uid_base=24000)
        try:
            async with GenvClient(first.url, first.gym_id) as a, GenvClient(second.url, second.gym_id) as b:
                async with a.execution(EDITOR_TASK) as ea, b.execution(EDITOR_TASK) as eb:
                    ua = first.manager.executions[ea.execution_id].desktop.uid
                    ub = second.manager.executions[eb.execution_id].desktop.uid
                    assert ua == 24000 and ub != ua, (ua, ub)
                    assert (gym_manager.UID_CLAIMS / f"{ub}.lock").exists()
        finally:
            second.stop()
    finally:
        first.stop()
    assert not first.manager._slot_uids and not second.manager._slot_uids   # given back at close
    third = start_gym_server(port=0, pool_size=0, max_executions=1, x_spares=0, uid_base=24000)
    try:
        async with GenvClient(third.url, third.gym_id) as c:
            async with c.execution(EDITOR_TASK) as ex:
                assert third.manager.executions[ex.execution_id].desktop.uid == 24000
    finally:
        third.stop()


def test_a_gym_start_sweeps_the_work_folders_dead_gyms_left(tmp_path):
    """A gym removes, as it starts, the work folders of gym servers that died (their pid file names a dead pid)
    and the empty ones an earlier removal left behind (a mount was still attached then) once a minute old;
    a live gym's folder, an empty one a starting gym may have just made, and anything with files but no pid
    file are kept."""
    import sys

    from cua_rl.local_gym import manager as gym_manager

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folders = {name: tmp_path / f"cua-gym-{name}" for name in ("dead", "live", "empty-old", "empty-new", "foreign")}
    for path in folders.values():
        path.mkdir()
    (folders["dead"] / "server.pid").write_text(str(dead.pid))
    (folders["dead"] / "home").mkdir()
    (folders["live"] / "server.pid").write_text(str(os.getpid()))
    (folders["foreign"] / "notes.txt").write_text("not a gym's")
    old = time.time() - 120
    for name in ("empty-old", "foreign"):
        os.utime(folders[name], (old, old))
    gym_manager._remove_stale_workdirs(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cua-gym-empty-new", "cua-gym-foreign", "cua-gym-live"]


def _serve(args: list[str], env: dict[str, str], log) -> subprocess.Popen:
    """``cua-gym serve ARGS`` (no desktops kept ready), its output into ``log``."""
    import sys

    return subprocess.Popen([sys.executable, "-m", "cua_rl.local_gym", "serve", "--pool-size", "0", "--x-spares", "0",
                             "--max-executions", "2", *args], env=env, stdout=log, stderr=subprocess.STDOUT)


async def test_a_gym_with_a_token_serves_only_its_holders(tmp_path, monkeypatch):
    """Issue 80: ``cua-gym serve --host 0.0.0.0`` (docs/cluster.md) answered anyone, so any client could act on, fork
    and end anyone's executions. With ``CUA_GYM_TOKEN`` in its environment every route but ``/health`` answers 401
    without the token (or with another), a stranger's requests change nothing, the genv client sends the token
    from the same variable, and the token is in no log line."""
    from cua_rl.http.serve import free_port

    token = "gym-" + os.urandom(16).hex()
    port, log_path = free_port(), tmp_path / "gym.log"
    with open(log_path, "w") as log:
        server = _serve(["--host", "0.0.0.0", "--port", str(port), "--log-level", "debug"],
                        {**os.environ, "CUA_GYM_TOKEN": token}, log)
    base, api = f"http://127.0.0.1:{port}", "/api/v1/desktop"
    try:
        assert wait_http(f"{base}/health", server, log_path).json()["ok"] is True        # /health stays open (fleets, load balancers)
        async with httpx.AsyncClient(base_url=base, timeout=60) as stranger:
            for headers in ({}, {"Authorization": "Bearer not-" + token}, {"Authorization": token}):
                refused = await stranger.post(f"{api}/tasks/{EDITOR_TASK}", json={}, headers=headers)
                assert refused.status_code == 401, refused.text
            for path in (f"{api}/tasks", "/metrics", f"{api}/capacity", "/openapi.json", "/docs"):
                assert (await stranger.get(path)).status_code == 401, path
            monkeypatch.setenv("CUA_GYM_TOKEN", token)
            async with GenvClient(base, "desktop") as owner, owner.execution(EDITOR_TASK) as ex:
                e = f"{api}/executions/{ex.execution_id}"
                for method, path, body in (("GET", e, None), ("GET", e + "/screenshot", None),
                                           ("POST", e + "/actions", {"action": {"type": "key", "keys": ["a"]}}),
                                           ("POST", e + "/fork", {"count": 1}), ("POST", e + "/evaluate", {}),
                                           ("POST", e + "/terminate", {}), ("GET", e + "/live?redirect=0", None)):
                    answer = await stranger.request(method, path, json=body)
                    assert answer.status_code == 401, (path, answer.text)
                    assert "Bearer" in answer.headers["www-authenticate"]
                assert (await owner.get_execution(ex.execution_id))["status"] == "running"   # untouched
                assert (await owner.act(ex.execution_id, {"type": "wait", "ms": 1}))["ok"] is True
    finally:
        stop(server, group=False)
    assert token not in log_path.read_text()


def test_a_gym_on_a_network_address_needs_a_token_or_says_it_serves_anyone(tmp_path):
    """Issue 80: without a token, ``cua-gym serve`` on an address other than loopback is refused at start with
    what to do; ``--insecure-no-token`` serves, with a WARNING line; a token file that cannot be read is named."""
    import sys

    from cua_rl.http.serve import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUA_GYM_TOKEN")}
    refused = subprocess.run([sys.executable, "-m", "cua_rl.local_gym", "serve", "--host", "0.0.0.0", "--port",
                              str(free_port()), "--pool-size", "0", "--x-spares", "0"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "refusing to serve on 0.0.0.0 without a token" in refused.stderr and "--token-file" in refused.stderr
    missing = subprocess.run([sys.executable, "-m", "cua_rl.local_gym", "serve", "--token-file",
                              str(tmp_path / "nope")], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"cannot read the token file {tmp_path / 'nope'}" in missing.stderr
    port, log_path = free_port(), tmp_path / "gym.log"
    with open(log_path, "w") as log:
        server = _serve(["--host", "0.0.0.0", "--port", str(port), "--insecure-no-token"], env, log)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server, log_path)
    finally:
        stop(server, group=False)
    assert "WARNING cua_rl.local_gym: cua-gym serves on 0.0.0.0 WITHOUT A TOKEN" in log_path.read_text()
