"""VM desktops in the gym, on a real tiny Linux guest under QEMU (TCG on this machine: its nested KVM does
not boot Linux): the genv API end to end, task set-up and validators through the guest agent, executions
resumed from one saved boot (never booting again, never sharing a disk), a VM that dies while it starts,
and nothing left behind by terminate, close or a SIGKILLed gym.

The guest is built from Debian packages on first use (``vm/guest_image.py``, a few seconds); the task is
``examples/vm_tasks/901-vm-shell-files.yaml``, the one the docs show.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from PIL import Image

from cua_rl.genv import GenvClient, GenvError
from cua_rl.http.serve import free_port
from cua_rl.local_gym import start_gym_server
from cua_rl.local_gym.env import GymError, LocalGym
from cua_rl.local_gym.manager import GymManager, GymOptions
from cua_rl.local_gym.tasks import load_tasks
from cua_rl.local_gym.vm import backend, guest_image
from cua_rl.local_gym.vm.agent import GuestAgent, GuestAgentError
from gym_helpers import names
from tests.hosts import descendants, wait_gone

TASKS = Path(__file__).resolve().parents[2] / "examples" / "vm_tasks"
TASK = "901"


@pytest.fixture(scope="module", autouse=True)
def guest():
    folder = guest_image.ensure()
    old = os.environ.get(guest_image.ENV)
    os.environ[guest_image.ENV] = str(folder)
    yield folder
    if old is None:
        os.environ.pop(guest_image.ENV, None)
    else:
        os.environ[guest_image.ENV] = old


def _qemu_pids(workdir: Path) -> set[int]:
    out = subprocess.run(["pgrep", "-f", f"qemu-system.*{workdir}"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_vm_task_through_the_genv_api_from_set_up_to_terminate(guest):
    base_before = _sha(guest / "base.qcow2")
    with start_gym_server(port=0, tasks_dir=str(TASKS), pool_size=1, x_spares=0) as gym:
        async with GenvClient(gym.url, gym.gym_id) as c:
            task = await c.get_task(TASK)
            assert task.raw["env_config"] == {"type": "vm", "os": "linux", "image": "base.qcow2"}
            async with c.execution(TASK) as ex:
                eid = ex.execution_id
                status = await c.get_execution(eid)
                assert status["screen"] == {"width": 1280, "height": 800}   # the guest's framebuffer
                png = await c.screenshot(eid)
                assert png[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(png)).size == (1280, 800)
                jpeg = await c.screenshot(eid, format="jpeg")
                assert jpeg[:2] == b"\xff\xd8"

                # set-up went in through the guest agent; the agent's work is still to do
                first = (await c.evaluate(eid)).raw["result"]
                got = {v["id"]: v["pass"] for v in first["validators"]}
                assert got == {"greeting": False, "date": False, "steps": True, "provisioned": True,
                               "folders": True}
                assert first["score"] == pytest.approx(3 / 6)

                # keys typed over QMP reach the guest's shell, which writes the files
                for action in load_tasks(TASKS).get(TASK).solution:
                    reply = await c.act(eid, action)
                    assert reply == {"ok": True, "screen_changed": True}
                assert await c.screenshot(eid) != png
                done = await c.evaluate(eid)
                files = gym.manager.executions[eid].desktop.files
                assert done.success is True and done.reward == 1.0, \
                    (done.raw["result"], {f: files.read(f, 100) for f in ("greeting.txt", "date.txt")})

                # refused input changes nothing: a character the VM keyboard cannot type
                reply = await c.act(eid, {"type": "type", "text": "é"})
                assert reply["ok"] is False and "no key" in reply["error"]
                with pytest.raises(GenvError) as err:
                    await c.act(eid, {"type": "click", "x": 2, "y": 0.5})
                assert err.value.status_code == 422

                vm = gym.manager.executions[eid].desktop.machine
                root, qemu = vm.root, vm.proc.pid
                assert (root / "overlay.qcow2").exists()
            assert wait_gone({qemu}) == set() and not root.exists(), "terminate left the VM behind"
        workdir = gym.manager.workdir
    assert _qemu_pids(workdir) == set() and not workdir.exists(), "closing the gym left VMs behind"
    assert _sha(guest / "base.qcow2") == base_before, "the base image was written"


async def test_executions_resume_one_saved_boot_on_disks_of_their_own(guest):
    # 90 s for a resumed machine's guest agent (the gym's default: 30 s): the pool's refill after b resumes beside a
    # and b under TCG, and beside the runs lane's fleet its guest once took longer than 30 s to answer (CI rehearsal,
    # session 36), which the gym takes for a bad saved state: it boots a second template (a template that is bad
    # still fails here, after 90 s)
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=1, x_spares=0, start_timeout_s=90)) as gym:
        a = (await gym.reset(TASK))["execution_id"]
        for _ in range(300):   # the pool resumes a spare in the background
            if gym.manager.pool_stats()["spares"]:
                break
            await asyncio.sleep(0.1)
        b = await gym.reset(TASK)
        assert b["warm"] is True   # handed out from the pool: resumed while the first one ran
        b = b["execution_id"]
        desk = {eid: gym.manager.executions[eid].desktop for eid in (a, b)}
        boot = {eid: d.agent.exec(["/bin/cat", "/proc/sys/kernel/random/boot_id"])[1] for eid, d in desk.items()}
        assert boot[a] == boot[b] and boot[a].strip(), "each execution continues the template's one boot"
        # the test guest's agent logs each request it reads to the serial port (what a silent guest's warning shows)
        assert "guest-exec" in desk[a].machine.log_tail(100_000, "serial.log"), "the agent's log is not on serial"
        await gym.act(a, {"type": "type", "text": "echo only-a > /root/greeting.txt\n"})
        assert desk[a].files.read("greeting.txt", 100) == "only-a\n"
        assert desk[b].files.read("greeting.txt", 100) is None, "an execution saw another's disk"
        overlays = {eid: d.machine.overlay for eid, d in desk.items()}
        assert overlays[a] != overlays[b]
        for eid in (a, b):
            await gym.terminate(eid)
            assert not overlays[eid].exists()
        templates = list((gym.manager.workdir / "vm-templates").iterdir())
        assert len(templates) == 1   # one boot for the gym, however many executions
        # a machine resumed long after its template was saved wakes with the template's clock: set to now
        await asyncio.sleep(8)
        c = (await gym.reset(TASK))["execution_id"]
        guest_now = int(gym.manager.executions[c].desktop.agent.exec(["/bin/date", "+%s"])[1])
        assert abs(guest_now - time.time()) < 1.5, "the resumed guest's clock was not set"


async def test_pointer_actions_reach_the_guest_as_absolute_tablet_events(guest):
    """The console ignores the mouse, so the guest's own input layer is read: a reader of the USB tablet's
    evdev node (started through the guest agent) records what a click and a scroll became."""
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0)) as gym:   # x_spares: the default
        eid = (await gym.reset(TASK))["execution_id"]
        assert gym.manager.pool_stats()["bare_x"] == 0 and not gym.manager._building_x   # no X for VM tasks
        agent = gym.manager.executions[eid].desktop.agent
        _, out, _ = agent.exec(["/bin/sh", "-c", 'for e in /sys/class/input/event*; do '
                                'grep -q Tablet "$e/device/name" && echo /dev/input/${e##*/}; done'])
        node = out.decode().strip()
        assert node.startswith("/dev/input/event"), "the guest has no USB tablet"
        agent.exec(["/bin/sh", "-c", f"cat {node} > /root/ev.bin 2>/dev/null </dev/null &"])
        await asyncio.sleep(0.3)
        assert (await gym.act(eid, {"type": "click", "x": 0.25, "y": 0.75}))["ok"] is True
        assert (await gym.act(eid, {"type": "scroll", "x": 0.5, "y": 0.5, "dy": 2}))["ok"] is True
        await asyncio.sleep(0.3)
        raw = agent.read_file("/root/ev.bin")
        events = [struct.unpack_from("qqHHi", raw, i)[2:] for i in range(0, len(raw) - 23, 24)]
        xs = [v / 32767 for t, c, v in events if (t, c) == (3, 0)]   # EV_ABS, ABS_X
        ys = [v / 32767 for t, c, v in events if (t, c) == (3, 1)]
        assert any(abs(x - 0.25) < 0.01 for x in xs) and any(abs(y - 0.75) < 0.01 for y in ys), (xs, ys)
        assert [v for t, c, v in events if (t, c) == (1, 0x110)] == [1, 0]   # BTN_LEFT down, up
        # REL_WHEEL: two notches down (the tablet may report them in one event of -2)
        assert sum(v for t, c, v in events if (t, c) == (2, 8)) == -2


async def test_a_vm_that_dies_while_it_starts_is_replaced(guest, monkeypatch):
    """The Windows example's failure: a VM dying during creation. Here QEMU is SIGKILLed right after it
    starts, before it has resumed; the manager's next attempt gives the execution a working machine."""
    real_start, killed = backend.Machine.start, []

    def start_and_kill_first(*args, **kwargs):
        vm = real_start(*args, **kwargs)
        if kwargs.get("incoming") is not None and not killed:
            killed.append(vm.root)
            os.kill(vm.proc.pid, signal.SIGKILL)
        return vm

    monkeypatch.setattr(backend.Machine, "start", start_and_kill_first)
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0, x_spares=0)) as gym:
        ex = await gym.reset(TASK)
        assert killed and not killed[0].exists(), "the dead VM's folder was left"
        result = await gym.evaluate(ex["execution_id"])
        assert result["result"]["validators"][3] == {"id": "provisioned", "pass": True, "score": 1.0,
                                                     "weight": 1.0, "message": "provisioned.txt: has content"}
        await gym.terminate(ex["execution_id"])

        # bounded: when every machine dies, create gives up after three and answers 503, leaving nothing
        killed.clear()
        monkeypatch.setattr(backend.Machine, "start", lambda *a, **k: _killed(real_start(*a, **k), killed))
        with pytest.raises(GymError) as err:
            await gym.reset(TASK)
        assert err.value.status == 503 and len(killed) == 3
        assert not any(root.exists() for root in killed)
        workdir = gym.manager.workdir
        assert _qemu_pids(workdir) == set() and not gym.manager.executions
    assert _qemu_pids(workdir) == set()


async def test_a_template_whose_guest_agent_is_silent_after_resuming_is_booted_again(guest, monkeypatch, caplog,
                                                                                        tmp_path):
    """CI once saw three machines in a row, resumed from one template, whose guest agent never answered: every
    retry resumed the same saved state. Here the first template's agent is frozen (SIGSTOP inside the guest)
    just before its state is saved; the first machine's agent is silent, on a new connection too, the manager's
    next attempt boots a new template, and the execution works."""
    real_save, poisoned = backend.Machine.save_state, []

    def save_with_a_frozen_agent(self, path, *args, **kwargs):
        if not poisoned:
            agent = GuestAgent.connect(str(self.agent_socket), 30)
            try:
                code, _, err = agent.exec(["/bin/sh", "-c", "(sleep 1; kill -STOP $(pidof qemu-ga)) "
                                                            "</dev/null >/dev/null 2>&1 &"])
                assert code == 0, err
            finally:
                agent.close()
            time.sleep(2.5)
            poisoned.append(Path(path))
        return real_save(self, path, *args, **kwargs)

    monkeypatch.setattr(backend.Machine, "save_state", save_with_a_frozen_agent)
    monkeypatch.setattr(backend, "SILENT_KEPT", tmp_path / "silent")
    caplog.set_level("WARNING", logger=backend.__name__)
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0, x_spares=0, start_timeout_s=10)) as gym:
        ex = await gym.reset(TASK)
        assert len(poisoned) == 1
        assert "did not answer" in caplog.text and "boots a new template" in caplog.text, caplog.text
        # a new connection was tried, and the warning says what the silent guest still did: its kernel ran (the
        # shell echoed a key), only its agent was stopped
        assert "nor on a new connection" in caplog.text, caplog.text
        assert "QEMU running; the screen changed after a key" in caplog.text, caplog.text
        # and keeps its screen and logs (the machine is gone): its agent, stopped, logged nothing after the resume
        [kept] = (tmp_path / "silent").iterdir()
        assert f"kept in {kept}" in caplog.text, caplog.text
        assert (kept / "screen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (kept / "qemu.log").is_file()
        assert "guest-sync" not in (kept / "serial.log").read_text(), "a stopped agent read our request"
        [tpl] = [t for (folder, _), t in backend._templates.items() if folder == str(gym.manager.workdir)]
        assert tpl.state != poisoned[0]
        result = await gym.evaluate(ex["execution_id"])
        assert result["result"]["validators"][3]["pass"] is True
        await gym.terminate(ex["execution_id"])
        workdir = gym.manager.workdir
    assert _qemu_pids(workdir) == set()


async def test_a_template_saved_with_a_request_cut_short_resumes_machines_whose_agent_answers(guest, monkeypatch,
                                                                                           caplog):
    """The guest agent's JSON parser lives on across our connections and across a saved state: a request cut short
    (a connection closed while QEMU had handed the guest only part of it, here on purpose just before the template
    is saved) stays in it, and every later request is read as part of that one. Without the parser's flush
    (agent.py: a 0xFF byte before each sync) every machine resumed from such a template is silent on every
    connection, the gym's signature of a bad template; with it, the first machine answers on its first
    connection and the template is kept. And a call that timed out does not hand its late reply to the next call
    (the protocol's sync after a time-out)."""
    real_save, cut = backend.Machine.save_state, []

    def save_with_a_request_cut_short(self, path, *args, **kwargs):
        if not cut:
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(str(self.agent_socket))
            # cut outside a string: what follows (whole requests) only nests deeper and never closes it (cut inside
            # a string, the next quote would end the string and the bare word after it reset the parser)
            raw.sendall(b'{"execute": "guest-exec", "arguments": {"path": "/bin/cut-short", "arg": [')
            # the agent logs what it reads to the serial port (qemu-ga --verbose): it holds the piece
            deadline = time.monotonic() + 30
            while "/bin/cut-short" not in self.log_tail(100_000, "serial.log") and time.monotonic() < deadline:
                time.sleep(0.1)
            raw.close()
            assert "/bin/cut-short" in self.log_tail(100_000, "serial.log"), "the guest agent never read the piece"
            cut.append(Path(path))
        return real_save(self, path, *args, **kwargs)

    monkeypatch.setattr(backend.Machine, "save_state", save_with_a_request_cut_short)
    caplog.set_level("WARNING", logger=backend.__name__)
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0, x_spares=0, start_timeout_s=20)) as gym:
        ex = await gym.reset(TASK)
        assert len(cut) == 1
        assert "did not answer" not in caplog.text and "new connection" not in caplog.text, caplog.text
        [tpl] = [t for (folder, _), t in backend._templates.items() if folder == str(gym.manager.workdir)]
        assert tpl.state == cut[0], "the template was booted again"
        result = await gym.evaluate(ex["execution_id"])
        assert result["result"]["validators"][3]["pass"] is True
        agent = gym.manager.executions[ex["execution_id"]].desktop.agent
        with pytest.raises(GuestAgentError, match="no answer"):
            agent.call("guest-info", timeout_s=0)
        assert isinstance(agent.call("guest-get-time"), int), "a timed-out call's late reply answered the next"
        await gym.terminate(ex["execution_id"])


def _killed(vm, log: list):
    log.append(vm.root)
    os.kill(vm.proc.pid, signal.SIGKILL)
    return vm


async def test_a_vm_that_dies_mid_episode_ends_that_execution_cleanly(guest):
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0, x_spares=0)) as gym:
        eid = (await gym.reset(TASK))["execution_id"]
        other = (await gym.reset(TASK))["execution_id"]
        vm = gym.manager.executions[eid].desktop.machine
        os.kill(vm.proc.pid, signal.SIGKILL)
        for call in (gym.screenshot(eid), gym.act(eid, {"type": "key", "keys": ["enter"]}), gym.evaluate(eid)):
            with pytest.raises(GymError) as err:
                await call
            assert err.value.status == 503   # the workflow drops the episode: an infrastructure failure
        await gym.terminate(eid)
        assert not vm.root.exists()
        # the other execution never noticed
        assert (await gym.act(other, {"type": "type", "text": "echo hello > /root/greeting.txt\n"}))["ok"] is True
        assert (await gym.evaluate(other))["result"]["validators"][0]["pass"] is True


async def test_a_vm_forks_into_children_in_its_exact_state_each_on_a_disk_of_its_own(guest, monkeypatch):
    """A fork by snapshot (vm/backend.py VMDesktop.freeze/thaw): two children whose screens are the parent's
    byte for byte and whose disks hold its files; an action on one changes neither the parent nor its sibling, and
    the parent goes on; a child that does not load the parent's screen is a 409 that leaves no machine; after
    terminate no QEMU runs and no frozen disk layer is left."""
    async with LocalGym(GymOptions(tasks_dir=str(TASKS), pool_size=0, x_spares=0)) as gym:
        eid = (await gym.reset(TASK))["execution_id"]
        assert (await gym.act(eid, {"type": "type", "text": "echo one > /root/a.txt\n"}))["ok"]
        before, _ = await gym.screenshot(eid)
        fork = await gym.fork(eid, {"count": 2})
        kids = [c["id"] for c in fork["executions"]]
        assert fork["mechanism"] == "snapshot" and fork["mask"] == [] and fork["actions"] == 1
        assert [(await gym.screenshot(x))[0] for x in (eid, *kids)] == [before] * 3
        desk = {x: gym.manager.executions[x].desktop for x in (eid, *kids)}
        assert {x: d.files.read("a.txt", 100) for x, d in desk.items()} == {x: "one\n" for x in desk}
        assert len({d.machine.overlay for d in desk.values()}) == 3

        assert (await gym.act(kids[0], {"type": "type", "text": "echo two > /root/b.txt\n"}))["ok"]
        assert (await gym.act(eid, {"type": "type", "text": "echo three > /root/c.txt\n"}))["ok"]
        got = {x: (d.files.read("b.txt", 100), d.files.read("c.txt", 100)) for x, d in desk.items()}
        assert got == {eid: (None, "three\n"), kids[0]: ("two\n", None), kids[1]: (None, None)}
        assert (await gym.screenshot(kids[1]))[0] == before

        workdir = gym.manager.workdir
        running = _qemu_pids(workdir)
        real_freeze = backend.VMDesktop.freeze

        def freeze_with_another_frame(self, folder):
            frozen = real_freeze(self, folder)
            frozen.frame = frozen.frame[:-1] + bytes([frozen.frame[-1] ^ 0xFF])   # one pixel the parent never had
            return frozen

        monkeypatch.setattr(backend.VMDesktop, "freeze", freeze_with_another_frame)
        with pytest.raises(GymError) as err:
            await gym.fork(kids[1], {"count": 2})
        assert err.value.status == 409 and "is not the parent's: 1 pixels differ" in err.value.detail, err.value.detail
        assert set(gym.manager.executions) == {eid, *kids} and wait_gone(_qemu_pids(workdir) - running) == set()
        assert not list((workdir / "vm-layers").glob("*.state")), "a refused fork left its saved state"

        # a fork cancelled while its children load (its HTTP client hung up: server.py) ends their machines
        monkeypatch.setattr(backend.VMDesktop, "freeze", real_freeze)
        cancelled = asyncio.create_task(gym.fork(kids[1], {"count": 2}))
        deadline = time.monotonic() + 60
        while len(_qemu_pids(workdir) - running) < 2 and not cancelled.done():
            assert time.monotonic() < deadline, "the fork's children never started"
            await asyncio.sleep(0.05)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert set(gym.manager.executions) == {eid, *kids}
        assert wait_gone(_qemu_pids(workdir) - running) == set(), "a cancelled fork left its children's machines"
        assert not list((workdir / "vm-layers").glob("*.state")), "a cancelled fork left its saved state"
        for x in (eid, *kids):
            await gym.terminate(x)
        assert _qemu_pids(workdir) == set() and list((workdir / "vm-layers").iterdir()) == []


def test_a_task_naming_a_missing_image_is_refused_at_load(tmp_path, guest, monkeypatch):
    text = (TASKS / "901-vm-shell-files.yaml").read_text()
    with monkeypatch.context() as m:
        m.delenv(guest_image.ENV)
        with pytest.raises(ValueError, match=f"environment variable {guest_image.ENV} is not set"):
            load_tasks(TASKS)
    (tmp_path / "901-vm.yaml").write_text(text.replace("$CUA_RL_VM_TEST_GUEST/base.qcow2", "/nonexistent/x.qcow2"))
    with pytest.raises(ValueError, match="VM image /nonexistent/x.qcow2 does not exist"):
        load_tasks(tmp_path)
    (tmp_path / "901-vm.yaml").write_text(text.replace("settle_s: 1", "settle_s: 1\n  apps: [{app: xterm}]"))
    with pytest.raises(ValueError, match="a VM task has no apps"):
        load_tasks(tmp_path)


def test_killing_the_gym_kills_its_vms():
    """SIGKILL: no cleanup code runs; QEMU gets the kernel's parent-death signal, and the next gym deletes
    the dead one's folder (overlays, templates, sockets)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cua_rl.local_gym", "serve", "--port", str(port),
                               "--tasks-dir", str(TASKS), "--pool-size", "1", "--x-spares", "0",
                               "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                r = httpx.post(f"{base}/api/v1/desktop/tasks/{TASK}", json={}, timeout=120)
                assert r.status_code == 200, r.text
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "gym did not come up"
                time.sleep(0.3)
        time.sleep(1.0)   # the pool's spare is resuming too
        qemus = {p for p, n in names(descendants([server.pid])).items() if n.startswith("qemu")}
        assert len(qemus) >= 1
        workdir = next(p.parent for p in Path("/tmp").glob("cua-gym-*/server.pid")
                       if p.read_text().strip() == str(server.pid))
        server.kill()
        server.wait(30)
        assert wait_gone(qemus) == set(), "QEMU outlived the gym"
        assert workdir.exists()
        asyncio.run(GymManager(GymOptions(tasks_dir=str(TASKS), x_spares=0)).close())   # the next gym
        assert not workdir.exists(), "the next gym did not delete the dead one's folder"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def _rfb_type(port: int, text: str) -> None:
    """A minimal VNC client: the RFB 3.8 handshake without a password, then ``text`` as key presses and a
    click, as a viewer that ignored "view only" would send them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        def need(n: int) -> bytes:
            out = b""
            while len(out) < n:
                chunk = s.recv(n - len(out))
                assert chunk, "the VNC server closed the connection"
                out += chunk
            return out

        s.sendall(need(12))                                   # echo the server's "RFB 003.008\n"
        types = need(need(1)[0])
        assert 1 in types, types                              # "None" security
        s.sendall(b"\x01")
        assert need(4) == b"\0\0\0\0"                         # SecurityResult: ok
        s.sendall(b"\x01")                                    # ClientInit, shared
        need(20)
        need(struct.unpack(">I", need(4))[0])                 # ServerInit's name
        for ch in text:
            for down in (1, 0):
                s.sendall(struct.pack(">BBxxI", 4, down, ord(ch)))
        s.sendall(struct.pack(">BBHH", 5, 1, 100, 100) + struct.pack(">BBHH", 5, 0, 100, 100))
        time.sleep(1.0)


async def test_a_vm_is_watched_live_and_its_viewers_cannot_type(guest, browser):
    """The live view of a VM (QEMU's own VNC, opened on a loopback port when asked, behind the view-only
    proxy): the page shows the guest's screen and follows the agent's typing; key presses sent to the proxy by
    a client that ignores "view only" reach nothing, while the same presses sent to QEMU's VNC port directly
    do change the guest's screen (the proxy is what stops them); the view ends with the execution."""
    from tests.chromium import canvas as _canvas, changed_pixels as _changed_pixels, wait_for, watch

    with start_gym_server(port=0, tasks_dir=str(TASKS), pool_size=0, x_spares=0) as gym:
        async with GenvClient(gym.url, gym.gym_id) as c:
            async with c.execution(TASK) as ex:
                eid = ex.execution_id
                url = httpx.get(gym.url + ex.raw["live_view"], params={"redirect": "0"}, timeout=60).json()["url"]
                view = gym.manager.executions[eid].live
                first = watch(browser, url)

                screen = Image.open(io.BytesIO(await c.screenshot(eid))).convert("RGB")
                dropped = view.proxy.dropped
                await asyncio.to_thread(_rfb_type, view.proxy.port, "echo viewer\n")
                assert view.proxy.dropped - dropped >= 2 * len("echo viewer\n") + 2
                time.sleep(1.0)
                same = Image.open(io.BytesIO(await c.screenshot(eid))).convert("RGB")
                assert _changed_pixels(screen, same) == 0, "a viewer's keys reached the guest"
                await asyncio.to_thread(_rfb_type, view.proxy.target[1], "x")     # QEMU's port itself: typed
                typed = Image.open(io.BytesIO(await c.screenshot(eid))).convert("RGB")
                assert _changed_pixels(same, typed) > 0, "the control: direct VNC input changes the guest"

                assert (await c.act(eid, {"type": "type", "text": "echo agent"}))["ok"]
                assert wait_for(browser, lambda d: _changed_pixels(first, _canvas(d)) > 100 or None, timeout=20)
                port = urlsplit(url).port
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()


async def test_the_keyboard_suite_on_the_guest_scores_one_and_untouched_below(tmp_path):
    """Issue 37 item 3 on the VM backend: the keyboard suite's VM target (busybox vi and sh on the guest), played
    as the keyboard agent format parses each solution, over QMP keys. CI plays one task per level and shell
    kind (each way a solution goes; the others differ only in their text), 6 of 50; CUA_GYM_TEST_ALL_VM_TASKS=1
    plays all 50 (about 60 s more under TCG; docs/notes/ci-ledger.md has the last full run)."""
    from cua_rl.local_gym import keyboard_suite as K
    from gym_helpers import keyboard_actions, solve_all

    K.write_suite("vm", tmp_path / "tasks")
    tasks = load_tasks(tmp_path / "tasks").tasks
    if os.environ.get("CUA_GYM_TEST_ALL_VM_TASKS") != "1":
        ways = {}
        for i, task in enumerate(tasks):
            ways.setdefault((K.level_of(i), K.shell_kind(i) if K.level_of(i) == "shell" else ""), task)
        tasks = list(ways.values())
        assert len(tasks) == 6
    t0 = time.monotonic()
    with start_gym_server(port=0, tasks_dir=str(tmp_path / "tasks"), max_executions=8, pool_size=1,
                          x_spares=0) as gym:
        failures = await solve_all(gym, tasks, tmp_path, lambda task: keyboard_actions(task.solution))
        assert gym.manager.executions == {}
    print(f"{len(tasks)} VM tasks in {time.monotonic() - t0:.1f} s")
    assert not failures, "\n".join(failures)
