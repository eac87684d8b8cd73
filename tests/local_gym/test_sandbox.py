"""Isolation, probed from inside: shell commands typed into a sandboxed terminal through the API.

Each probe writes its outcome into the execution's HOME, which the test reads from the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cua_rl.genv import GenvClient
from cua_rl.http.serve import free_port
from cua_rl.local_gym import mounts
from cua_rl.local_gym.desktop import SANDBOX_ETC
from gym_helpers import names
from tests.hosts import descendants, stop, wait_gone, wait_http

pytestmark = pytest.mark.desktop
TERMINAL_TASK = "012"   # xterm, maximised, focused
REPO_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"   # a world-readable host file
assert REPO_FILE.exists()


async def _wait_file(path: Path, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("rc=") >= 1 and path.read_text().endswith("\n"):
            return path.read_text()
        await asyncio.sleep(0.1)
    raise AssertionError(f"probe never wrote {path.name}")


async def test_terminal_cannot_reach_host_files_network_or_other_displays(gym):
    secret = "HOST-SECRET-" + secrets.token_hex(8)
    host_file = Path(f"/tmp/cua-probe-{secrets.token_hex(4)}.txt")
    host_file.write_text(secret + "\n")
    os.chmod(host_file, 0o644)          # world-readable: only the sandbox can keep it out
    gym_port = int(gym.url.rsplit(":", 1)[1])
    try:
        async with GenvClient(gym.url, gym.gym_id) as c:
            async with c.execution(TERMINAL_TASK) as a, c.execution(TERMINAL_TASK) as b:
                mine = gym.manager.executions[a.execution_id].desktop
                other = gym.manager.executions[b.execution_id].desktop
                probes = [
                    "printf '\\a'; echo rc=$? > bell.txt",   # an untrusted client's Bell is refused: xterm rings none
                    f"{{ cat {host_file}; cat {REPO_FILE}; ls /root; }} > files.txt 2>&1; "
                    f"echo rc=$? >> files.txt",
                    f"timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/{gym_port}' > net.txt 2>&1; echo rc=$? >> net.txt; "
                    f"timeout 3 bash -c 'echo > /dev/tcp/1.1.1.1/80' >> net.txt 2>&1; echo rc=$? >> net.txt",
                    f"xdpyinfo -display {other.display} > /dev/null 2> dpy.txt; echo rc=$? >> dpy.txt; "
                    f"xdpyinfo -display {mine.display} | head -1 > own.txt; echo rc=$? >> own.txt",
                    "id -u > who.txt; touch /usr/probe 2>> who.txt; echo rc=$? >> who.txt",
                    "{ ulimit -u; ulimit -f; df -k /tmp | tail -1; } > limits.txt; echo rc=$? >> limits.txt",
                    "{ ls -A /etc; cat /etc/shadow; df -k ~ | tail -1; } > etc.txt 2>&1; echo rc=$? >> etc.txt",
                ]
                for cmd in probes:
                    await c.act(a.execution_id, {"type": "type", "text": cmd + "\n"})
                home = mine.home
                await _wait_file(home / "bell.txt")
                files = await _wait_file(home / "files.txt")   # the terminal outlived its bell
                net = await _wait_file(home / "net.txt")
                dpy = await _wait_file(home / "dpy.txt")
                own = await _wait_file(home / "own.txt")
                who = await _wait_file(home / "who.txt")
                limits = await _wait_file(home / "limits.txt")
                etc = await _wait_file(home / "etc.txt")
                sandbox_limits = gym.manager.opt.limits
    finally:
        host_file.unlink()
    assert secret not in files and "[build-system]" not in files and "No such file" in files, files
    assert net.count("rc=") == 2 and "rc=0" not in net, net
    assert "unable to open display" in dpy and "rc=0" not in dpy, dpy
    assert "name of display" in own, own   # the probe itself works: its own display is reachable
    uid_line, *rest = who.splitlines()
    assert int(uid_line) != 0 and "Read-only file system" in who and who.strip().endswith("rc=1"), who
    nproc, fsize_blocks, df_line, _ = limits.splitlines()
    assert int(nproc) >= sandbox_limits.nproc and (os.geteuid() != 0 or int(nproc) == sandbox_limits.nproc), limits
    assert int(fsize_blocks) * 1024 == sandbox_limits.fsize_bytes, limits  # ulimit -f counts 1 KiB blocks
    assert int(df_line.split()[1]) * 1024 == sandbox_limits.tmp_bytes, limits  # tmpfs /tmp is capped
    *listed, shadow, home_df, _ = etc.splitlines()
    assert set(listed) <= {*SANDBOX_ETC, "passwd", "group"}, etc
    assert {"passwd", "ld.so.cache", "fonts"} <= set(listed), etc
    assert "No such file" in shadow, etc   # only the allow-listed parts of the host's /etc
    if mounts.can_mount():   # HOME is a tmpfs of the quota's size
        assert int(home_df.split()[1]) * 1024 == sandbox_limits.home_bytes, etc


X_KILL_ALL = Path(__file__).with_name("x_kill_all.py")   # issue 80's attack, typed into the terminal


async def _wait_report(path: Path, until: str, timeout_s: float = 20.0) -> str:
    """The attack's report once it holds ``until`` or the attack gave up ("done")."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if until in text or text.endswith("done\n"):
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"the attack never got to {until!r}: {path.read_text() if path.exists() else 'no report'}")


@contextlib.asynccontextmanager
async def _x_kill_attack(gym, http: httpx.AsyncClient, loop: bool):
    """A terminal desktop running issue 80's attack (``X_KILL_ALL``, round after round with ``loop``): (the
    execution's URL, its id, its desktop) once the attack sent its first KillClients. At the end the execution is
    terminated (200), the gym's capacity is whole again and nothing of the desktop outlives it."""
    script = "".join(line for line in X_KILL_ALL.read_text().splitlines(keepends=True) if not line.startswith("#"))
    base = f"{gym.url}/api/v1/{gym.gym_id}"
    capacity = (await http.get(f"{base}/capacity")).json()
    created = await http.post(f"{base}/tasks/{TERMINAL_TASK}", json={})
    assert created.status_code == 200, created.text
    eid = created.json()["execution_id"]
    desk = gym.manager.executions[eid].desktop
    pids = descendants(desk.pids())
    try:
        command = f"{'X_KILL_LOOP=1 ' if loop else ''}python3 - <<'EOF'\n{script}EOF\n"
        typed = await http.post(f"{base}/executions/{eid}/actions", json={"action": {"type": "type", "text": command}})
        assert typed.status_code == 200 and typed.json()["ok"], typed.text
        report = await _wait_report(desk.home / "xkill.txt", "looping\n" if loop else "done\n")
        assert "sent" in report, report   # it connected and sent its KillClients
        yield f"{base}/executions/{eid}", eid, desk
    finally:
        ended = await http.post(f"{base}/executions/{eid}/terminate", json={})
    assert ended.status_code == 200, ended.text
    assert (await http.get(f"{base}/capacity")).json() == capacity
    assert wait_gone(pids) == set(), "desktop processes outlived the terminate"


async def test_a_desktop_cannot_kill_the_gyms_x_connections(gym):
    """Issue 80: python3 typed into a desktop's terminal sends KillClient to every client of its X server (raw X
    protocol: X-Resource's list, then every client id base) but itself and its terminal. The apps are untrusted X
    clients: every KillClient of a trusted client (the gym's frame, DAMAGE and XTEST connections, the window
    manager) is refused, none is killed, the gym's connections are the ones it had, and the execution's
    screenshots and actions answer with no gym fault."""
    async with httpx.AsyncClient(timeout=60) as http, _x_kill_attack(gym, http, loop=False) as (url, eid, desk):
        connections = (desk.xinput, desk.screen)
        report = (desk.home / "xkill.txt").read_text()
        shot = await http.get(f"{url}/screenshot")
        assert shot.status_code == 200, f"{shot.status_code} {shot.text} after the attack ({report!r})"
        click = await http.post(f"{url}/actions", json={"action": {"type": "click", "x": 0.5, "y": 0.5}})
        assert click.status_code == 200 and click.json()["ok"], click.text
        tally = _tally(report)
        assert tally["killed"] == 0 and tally["refused"] >= 2, report   # the gym's, the window manager's
        assert (desk.xinput, desk.screen) == connections, "the gym's X connections were lost and opened again"
        assert gym.manager.executions[eid].faults["gym"] == 0


async def test_a_desktop_killing_x_clients_in_a_loop_causes_no_gym_fault(gym):
    """The attack in a tight loop (round after round of KillClient to every client) while the policy takes
    screenshots and acts: with the apps trusted, the gym re-opened its lost connections and the loop killed them
    again before the next request (a 503, a gym fault). Untrusted apps cannot kill them at all: every call
    answers, with no gym fault and no connection opened again."""
    async with httpx.AsyncClient(timeout=60) as http, _x_kill_attack(gym, http, loop=True) as (url, eid, desk):
        connections = (desk.xinput, desk.screen)
        for i in range(6):
            shot = await http.get(f"{url}/screenshot")
            assert shot.status_code == 200, f"screenshot {i}: {shot.status_code} {shot.text}"
            moved = await http.post(f"{url}/actions", json={"action": {"type": "move", "x": 0.1 * i, "y": 0.5}})
            assert moved.status_code == 200 and moved.json()["ok"], f"action {i}: {moved.text}"
        (desk.home / "stop").touch()
        report = await _wait_report(desk.home / "xkill.txt", "done\n")
        tally = _tally(report)
        assert tally["rounds"] > 1 and tally["killed"] == 0 and tally["refused"] >= 2 * tally["rounds"], report
        assert (desk.xinput, desk.screen) == connections, "the gym's X connections were lost and opened again"
        assert gym.manager.executions[eid].faults["gym"] == 0


def _tally(report: str) -> dict[str, int]:
    """The attack's closing counts: rounds, killed, refused (BadAccess), no such client."""
    found = re.search(r"(\d+) rounds, (\d+) killed, (\d+) refused \(BadAccess\), (\d+) no such client", report)
    assert found, f"the attack did not finish: {report!r}"
    return dict(zip(("rounds", "killed", "refused", "absent"), map(int, found.groups())))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_the_server_leaves_no_desktop_process(sig):
    """SIGKILL: no cleanup code runs, the kernel's parent-death signal must do it. SIGTERM: orderly shutdown."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cua_rl.local_gym", "serve", "--port", str(port),
                               "--max-executions", "4", "--pool-size", "1", "--max-spares", "2",
                               "--prewarm", "012,001", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health", server, ready=lambda a: a.status_code == 200 and a.json()["pool"]["spares"] >= 2)
        for task in ("001", "012"):
            r = httpx.post(f"{base}/api/v1/desktop/tasks/{task}", json={}, timeout=60)
            assert r.status_code == 200, r.text
        time.sleep(1.0)  # let the pool start refilling too
        procs = descendants([server.pid]) - {server.pid}
        running = set(names(procs).values())
        assert {"Xvfb", "openbox", "bwrap", "dbus-daemon", "mousepad", "xterm"} <= running, running
        workdirs = [p.parent for p in Path("/tmp").glob("cua-gym-*/server.pid")
                    if p.read_text().strip() == str(server.pid)]
        assert len(workdirs) == 1
        if mounts.can_mount():   # the HOME mounts live in the server's own mount namespace, not in ours
            assert mounts.mounted_under(workdirs[0]) == []
            assert Path(f"/proc/{server.pid}/mountinfo").read_text().count(f" {mounts.SOURCE} ") >= 2
        server.send_signal(sig)
        code = server.wait(30)
        assert code in ((0, -signal.SIGTERM) if sig == signal.SIGTERM else (-signal.SIGKILL,))
        if sig == signal.SIGTERM:  # the orderly shutdown ran: it removes its work folder last
            assert not workdirs[0].exists()
        assert wait_gone(procs) == set(), f"desktop processes outlived the gym ({sig.name})"
    finally:
        stop(server, signal.SIGKILL, group=False)


@pytest.mark.skipif(not mounts.can_mount(), reason="HOME is a tmpfs only when the gym runs as root")
async def test_home_quota_is_enforced_by_the_kernel_and_unmounted_at_the_end():
    """A write past the quota fails inside the sandbox (ENOSPC) and the host disk gets nothing of it."""
    from cua_rl.local_gym import start_gym_server
    from cua_rl.local_gym.desktop import SandboxLimits

    quota = 2 << 20
    server = start_gym_server(port=0, max_executions=1, pool_size=0, limits=SandboxLimits(home_bytes=quota))
    try:
        workdir = server.manager.workdir
        async with GenvClient(server.url, server.gym_id) as c:
            ex = await c.create_execution(TERMINAL_TASK)
            desk = server.manager.executions[ex.execution_id].desktop
            assert desk.home_mounted and mounts.mounted_under(workdir) == [desk.home]
            # HOME is full after the write: the probe frees it before it reports (from /tmp, outside HOME)
            await c.act(ex.execution_id, {"type": "type", "text": (
                "head -c 5000000 /dev/zero > big.bin 2> /tmp/err; r=$?; s=$(stat -c %s big.bin); rm big.bin; "
                "{ echo size=$s; cat /tmp/err; echo rc=$r; } > fill.txt\n")})
            fill = await _wait_file(desk.home / "fill.txt")
            assert "rc=1" in fill and "No space left" in fill, fill
            assert 0 < int(fill.split("size=")[1].split()[0]) <= quota, fill
            await c.get_execution(ex.execution_id)   # still alive (a 404 would raise)
            await c.terminate(ex.execution_id)
        assert mounts.mounted_under(workdir) == []
    finally:
        server.stop()


async def test_filling_home_past_its_quota_ends_the_execution(monkeypatch):
    """Without the tmpfs (a gym that is not root), the reaper's polling is the limit."""
    from cua_rl.genv import GenvError
    from cua_rl.local_gym import start_gym_server
    from cua_rl.local_gym.desktop import SandboxLimits

    monkeypatch.setattr(mounts, "can_mount", lambda: False)   # the non-root path of our own code
    server = start_gym_server(port=0, max_executions=1, pool_size=0, reap_interval_s=0.2,
                              limits=SandboxLimits(home_bytes=2 << 20))
    try:
        async with GenvClient(server.url, server.gym_id) as c:
            ex = await c.create_execution(TERMINAL_TASK)
            assert not server.manager.executions[ex.execution_id].desktop.home_mounted
            pids = descendants(server.manager.executions[ex.execution_id].desktop.pids())
            await c.act(ex.execution_id, {"type": "type", "text": "head -c 5000000 /dev/zero > big.bin\n"})
            deadline = time.monotonic() + 20
            while ex.execution_id in server.manager.executions and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            with pytest.raises(GenvError) as err:
                await c.get_execution(ex.execution_id)
            assert err.value.status_code == 404
            assert wait_gone(pids) == set()
    finally:
        server.stop()


SWAP_TASK = """number: "901"
name: swap-probe
category: terminal
difficulty: easy
instruction: Leave f.txt as it is.
setup:
  files: {"f.txt": "plain\\n"}
  apps: [{app: xterm}]
validators:
  - {id: read, type: file_contains, path: f.txt, text: "%s"}
  - {id: there, type: file_exists, path: f.txt}
solution: [{type: wait, ms: 1}]
"""
# Typed into a desktop's xterm: f.txt turns, as fast as Python can rename, into a regular file, a FIFO (an open()
# for reading waits for a writer forever) and a link to a root-only host file, for as long as the desktop lives.
SWAPPER = ("printf '%%s\\n' 'import os' 'os.mkfifo(\"p\")' 'open(\"r\", \"w\").write(\"plain\")' "
           "'os.symlink(\"%s\", \"l\")' 'while 1:' ' for s in \"rpl\":' "
           "'  os.link(s, \"t\", follow_symlinks=False); os.replace(\"t\", \"f.txt\")' > swap.py; "
           "python3 swap.py &\n")
# Typed into one of them too: an X client that grabs the whole X server (then no other client is served) and
# keeps the grab.
GRABBER = ("python3 -c 'import ctypes, time; x = ctypes.CDLL(\"libX11.so.6\"); x.XOpenDisplay.restype = "
           "ctypes.c_void_p; d = ctypes.c_void_p(x.XOpenDisplay(None)); x.XGrabServer(d); x.XSync(d, 0); "
           "time.sleep(600)' &\n")


def _grabbed(display: str, timeout_s: float = 1.0) -> bool:
    """Whether the X server of ``display`` serves a new client (a round trip within ``timeout_s``). This process
    has no cookie for the gym's displays: a refusal is an answer all the same (a grabbed server gives none)."""
    from Xlib import display as xdisplay, error as xerror

    def probe() -> None:
        try:
            d = xdisplay.Display(display)
        except xerror.DisplayConnectionError:
            return
        d.screen().root.get_geometry()
        d.close()

    import threading
    thread = threading.Thread(target=probe, daemon=True)   # left blocked for good when the server is grabbed
    thread.start()
    thread.join(timeout_s)
    return thread.is_alive()


async def test_fifo_link_swaps_and_a_server_grab_under_load_wedge_nothing_and_sigterm_stops_the_gym(tmp_path):
    """Issue 66: three desktops swap a validated file for a FIFO or a link to a root-only host file while their
    evaluates run, over and over, and one of them also grabs its X server for good. No evaluate reads the host
    file or hangs; the grabbing execution's screenshots and actions answer; the fourth execution's
    screenshots, evaluates and terminate answer in time all along; and SIGTERM stops the real
    ``cua-gym serve`` with the hostile desktops still running, leaving no desktop process."""
    secret = "HOST-SECRET-" + secrets.token_hex(8)
    secret_file = Path(f"/tmp/cua-swap-secret-{secrets.token_hex(4)}")
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)                    # the gym's (root's) alone
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "901-swap-probe.yaml").write_text(SWAP_TASK % secret)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cua_rl.local_gym", "serve", "--port", str(port),
                               "--tasks-dir", str(tmp_path / "tasks"), "--pool-size", "0", "--x-spares", "0",
                               "--display-base", "860", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, answered_in = f"http://127.0.0.1:{port}/api/v1/desktop", 8.0
    try:
        await asyncio.to_thread(wait_http, f"http://127.0.0.1:{port}/health", server)
        async with httpx.AsyncClient(timeout=answered_in) as http:
            created = await asyncio.gather(*(http.post(f"{base}/tasks/901", json={}, timeout=60) for _ in range(4)))
            assert all(r.status_code == 200 for r in created), [r.text for r in created]
            *attacked, control = [r.json()["execution_id"] for r in created]
            grabbing, grabbed_display = attacked[0], created[0].json()["device"]["display"]
            procs = descendants([server.pid]) - {server.pid}
            for eid in attacked:
                typed = await http.post(f"{base}/executions/{eid}/actions",
                                        json={"action": {"type": "type", "text": SWAPPER % secret_file}})
                assert typed.status_code == 200 and typed.json()["ok"], typed.text
            typed = await http.post(f"{base}/executions/{grabbing}/actions",
                                    json={"action": {"type": "type", "text": GRABBER}})
            assert typed.status_code == 200, typed.text
            deadline = time.monotonic() + 10
            while not await asyncio.to_thread(_grabbed, grabbed_display):
                assert time.monotonic() < deadline, "the desktop's X client never grabbed the server"

            # Each hostile execution runs at least 10 evaluates (3 s at the least): a count, not a time, so a loaded
            # machine makes the test slower, not weaker. The fourth execution answers all along.
            hammered = asyncio.Event()

            async def hammer(eid: str) -> list[dict]:
                results, least, stop = [], time.monotonic() + 3.0, time.monotonic() + 90.0
                while sum("result" in r for r in results) < 10 or time.monotonic() < least:
                    assert time.monotonic() < stop, f"only {len(results)} evaluates in 90 s"
                    r = await http.post(f"{base}/executions/{eid}/evaluate", json={})
                    assert r.status_code in (200, 503), r.text
                    results.append(r.json())
                    if eid == grabbing:   # its X server serves nobody else, but the gym still sees its screen
                        shot = await http.get(f"{base}/executions/{eid}/screenshot")
                        assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"
                return results

            async def hammers() -> list[list[dict]]:
                try:
                    return await asyncio.gather(*map(hammer, attacked))
                finally:
                    hammered.set()

            async def control_answers() -> int:
                calls = 0
                while not hammered.is_set() or calls < 3:
                    t0 = time.monotonic()
                    shot = await http.get(f"{base}/executions/{control}/screenshot")
                    assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"
                    assert (await http.post(f"{base}/executions/{control}/evaluate", json={})).status_code == 200
                    assert time.monotonic() - t0 < answered_in
                    calls += 1
                return calls

            evaluated, calls = await asyncio.gather(hammers(), control_answers())
            print(f"the fourth execution answered {calls} screenshot and evaluate pairs, each within {answered_in} s")
            validators = [v for results in evaluated for r in results for v in r.get("result", {}).get("validators", [])]
            read = [v for v in validators if v["id"] == "read"]
            assert len(read) >= 30, f"too few evaluates ran: {len(read)}"
            assert not [v for v in read if v["pass"]], "an evaluate read the root-only host file through a link"
            assert not [v for v in validators if secret in v["message"]]
            refused = [v for v in read if "link" in v["message"] or "regular file" in v["message"]]
            print(f"{len(read)} evaluates under swapping; {len(refused)} met a link or FIFO and refused it")
            t0 = time.monotonic()
            acted = await http.post(f"{base}/executions/{grabbing}/actions",
                                    json={"action": {"type": "key", "keys": ["a"]}}, timeout=30)
            assert acted.status_code == 200 and acted.json()["ok"], acted.text
            print(f"an action on the grabbed desktop answered in {time.monotonic() - t0:.1f} s")
            assert (await http.post(f"{base}/executions/{control}/terminate", json={})).status_code == 200
        t0 = time.monotonic()
        server.send_signal(signal.SIGTERM)   # the swapping executions still run
        assert server.wait(20) in (0, -signal.SIGTERM), "the gym did not stop on SIGTERM"
        print(f"stopped {time.monotonic() - t0:.1f} s after SIGTERM")
        assert wait_gone(procs) == set(), "desktop processes outlived the gym"
    finally:
        secret_file.unlink()
        stop(server, signal.SIGKILL, group=False)
