"""The ``vm`` desktop backend: a task whose ``setup`` names a VM image runs on a QEMU machine instead of an X11
desktop, behind the same genv API, action schema and validators.

How an execution gets its machine without booting:
1. The first time a gym needs a VM spec (a prewarmed task, or the first create), it boots a *template*
   machine on an overlay of the user's base image, waits for the guest agent to answer (the guest has
   booted) and ``settle_s`` more, saves its RAM and device state to a file and quits. The template's
   overlay is frozen from then on. Cost: one boot per gym and VM spec (``boot_s``).
2. Every execution's machine is a new overlay *on the template's overlay*, with QEMU resuming the saved
   state (``-incoming``): the guest continues where the template stopped, on a disk no other execution
   writes (``resume_s``, ~0.2 s for the test guest under TCG). The base image is never written.
3. The manager's warm pool keeps such resumed machines ready (pool key: the VM spec), so a create hands one
   out at once; a machine is never reused, so an execution never sees another's writes.

A fork (``LocalGym.fork``) snapshots a running machine the same way: ``VMDesktop.freeze`` pauses it, freezes its
overlay as a disk layer (``layers.py``; the machine goes on writing to a new overlay over it), saves its RAM and
devices and runs it again; ``VMDesktop.thaw`` resumes each child from that file on an overlay of its own over the
frozen layer, checks while it is still paused that its screen is the parent's byte for byte, and runs it.

Seeing and acting go through QMP only (``VMScreen``: ``screendump``; ``VMInput``: ``input-send-event``), so the
guest needs no agent for them. Task files, set-up commands and validators go through the QEMU guest agent
(``GuestFiles``, ``agent.py``), which exists for Linux and Windows guests.

Lifetime: QEMU is started from the manager's spawner threads (``procs``), so it dies with the gym even when
the gym is SIGKILLed; ``stop`` deletes the execution's folder (overlay, sockets, logs). The templates live
in the gym's work folder, deleted at close (or by the next gym, when this one was killed).
QEMU runs as the gym's user: the guest is the sandbox.
"""

from __future__ import annotations

import asyncio
import io
import logging
import ntpath
import posixpath
import re
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from PIL import Image

from ..desktop import DesktopSpec, SandboxLimits
from ..fork import ForkRefused, difference
from ..screen import Screen
from . import layers
from .agent import GuestAgent, GuestAgentError
from .keys import MODIFIERS, char_qcode, keysym_qcode
from .machine import Machine, VMSpec
from .qmp import QMPError

logger = logging.getLogger(__name__)

BUTTONS = {1: "left", 2: "middle", 3: "right"}
RECONNECT_S = 15.0   # a resumed guest's agent silent on its first connection: the most a new one waits
# A resumed guest silent on both connections: its screen and QEMU's logs are kept here (the newest SILENT_KEEP), since
# the machine itself is discarded; the warning names the folder.
SILENT_KEPT = Path(tempfile.gettempdir()) / "cua-rl-vm-silent"
SILENT_KEEP = 10
GUEST_OSES = ("linux", "windows")


@dataclass(frozen=True)
class VMDesktopSpec(DesktopSpec):
    """A task's VM: the machine (``vm``), what the guest is, and how long its first boot may take. The
    task's files and folders (``files``/``dirs``, guest paths) are written when an execution starts, so
    every task on the same machine shares the warm pool."""

    vm: VMSpec = field(default_factory=VMSpec)
    guest_os: str = "linux"
    guest_home: str = "/root"          # where relative guest paths point
    boot_timeout_s: float = 600.0      # the template's boot, until the guest agent answers
    settle_s: float = 2.0              # then this long before its state is saved (the desktop finishes drawing)

    @property
    def desktop_class(self) -> type["VMDesktop"]:
        return VMDesktop

    @property
    def pool_key(self) -> tuple:
        return ("vm", self.vm, self.guest_os, self.guest_home, self.boot_timeout_s, self.settle_s)


# -- templates: one booted-and-saved machine per gym folder and VM spec ------------------------------------
@dataclass
class Template:
    overlay: Path
    state: Path
    boot_s: float
    save_s: float


_templates: dict[tuple[str, tuple], Template] = {}
_template_locks: dict[tuple[str, tuple], threading.Lock] = {}
_registry_lock = threading.Lock()


def template_for(spec: VMDesktopSpec, workdir: Path, timeout_s: float) -> Template:
    """The saved template for ``spec`` in this gym folder, booting it the first time (blocking; one boot at a
    time per spec: other builders wait for it)."""
    key = (str(workdir), spec.pool_key)
    with _registry_lock:
        lock = _template_locks.setdefault(key, threading.Lock())
    with lock:
        tpl = _templates.get(key)
        if tpl is not None and tpl.state.exists():
            return tpl
        _templates[key] = tpl = boot_template(spec, workdir / "vm-templates", timeout_s)
        return tpl


def discard_template(spec: VMDesktopSpec, workdir: Path, tpl: Template) -> bool:
    """Forget ``tpl`` if it is still the template of ``spec`` in this gym folder, so the next machine boots a
    new one (returns whether it was). Its files stay: machines resumed from it may still run on its overlay;
    they go with the gym folder."""
    with _registry_lock:
        key = (str(workdir), spec.pool_key)
        if _templates.get(key) is not tpl:
            return False
        del _templates[key]
        return True


def forget_templates(workdir: Path) -> None:
    """Drop the registry's entries of a gym folder (the gym closed; its folder is deleted)."""
    with _registry_lock:
        for key in [k for k in _templates if k[0] == str(workdir)]:
            _templates.pop(key, None)
            _template_locks.pop(key, None)


def boot_template(spec: VMDesktopSpec, folder: Path, timeout_s: float) -> Template:
    folder.mkdir(mode=0o700, exist_ok=True)
    t0 = time.monotonic()
    logger.info("booting the VM template of %s (%s; at most %.0f s)", spec.vm.base_image or spec.vm.kernel,
                "/".join(spec.vm.accel), spec.boot_timeout_s)
    vm = Machine.start(spec.vm, workdir=folder, timeout_s=timeout_s)
    try:
        alive = lambda: vm.proc is not None and vm.proc.poll() is None  # noqa: E731
        try:
            GuestAgent.connect(str(vm.agent_socket), spec.boot_timeout_s, alive).close()
        except GuestAgentError as exc:
            raise RuntimeError(f"the VM template did not boot to its guest agent: {exc}; QEMU said: "
                               f"{vm.log_tail()}") from exc
        boot_s = time.monotonic() - t0
        time.sleep(spec.settle_s)
        t1 = time.monotonic()
        state = vm.root / "state.bin"
        vm.save_state(state)
        save_s = time.monotonic() - t1
    except BaseException:
        vm.stop()
        raise
    vm.stop(keep_files=True)
    logger.info("VM template booted in %.1f s (%s), state saved in %.2f s (%d MiB)", boot_s, vm.accel, save_s,
                state.stat().st_size >> 20)
    return Template(vm.overlay, state, boot_s, save_s)


# -- screen, input, files -----------------------------------------------------------------------------------
class VMScreen(Screen):
    """Frames from QMP ``screendump`` (PPM: a header, then RGB), with ``Screen``'s encoding cache. No DAMAGE:
    the settle wait polls, slower than on X (a dump is milliseconds, not a quarter of one)."""

    # the settle wait's polling (screen.settle): a dump takes ~7 ms (1280x800); the test guest's console echoes a
    # key within ~11 ms, a desktop guest may redraw in several steps
    poll_s, stable_s = 0.015, 0.05

    def __init__(self, machine: Machine) -> None:
        self._vm = machine
        self._init_cache()
        self.damage = None
        self.grab()

    def close(self) -> None:
        pass

    def grab(self) -> bytearray:
        raw = bytearray(self._vm.screendump())
        m = re.match(rb"P6\s+(\d+)\s+(\d+)\s+\d+\s", raw[:64])
        if m is None:
            raise RuntimeError("screendump wrote no PPM image")
        self.width, self.height = int(m.group(1)), int(m.group(2))
        return raw

    def image(self, raw: bytearray) -> Image.Image:
        return Image.open(io.BytesIO(bytes(raw)))

    def _encode_now(self, raw: bytearray, fmt: str, quality: int) -> bytes:
        """QEMU's screendump is a PPM, not an X frame: through Pillow."""
        out = io.BytesIO()
        if fmt == "jpeg":
            self.image(raw).save(out, "JPEG", quality=quality)
        else:
            self.image(raw).save(out, "PNG", compress_level=1)
        return out.getvalue()


class VMInput:
    """``XInput``'s calls (what ``actions.perform`` plays) as QMP input events: a USB tablet (absolute
    pointer) and the PS/2 keyboard. Pixels arrive in the spec's size and leave as fractions of the screen."""

    def __init__(self, machine: Machine, width: int, height: int) -> None:
        self._vm, self._w, self._h = machine, width, height

    def _at(self, x: int, y: int) -> None:
        self._vm.move(x / max(1, self._w - 1), y / max(1, self._h - 1))

    def _btn(self, button: int, down: bool) -> dict:
        return {"type": "btn", "data": {"down": down, "button": BUTTONS.get(button, "left")}}

    def keyboard_ready(self) -> bool:
        """The guest's keyboard has no focus to wait for on this side (``XInput.keyboard_ready``)."""
        return True

    def focus_unmoved(self) -> bool:
        """The guest's keyboard has no focus to follow on this side (``XInput.focus_unmoved``)."""
        return True

    def keys_processed(self, timeout_s: float = 0.0) -> None:
        """No ping to the guest's programs (``XInput.keys_processed``): its keyboard is paced as it types."""
        return None

    def pointer_client(self) -> int:
        """No window to find on this side (``XInput.pointer_client``)."""
        return 0

    def processed(self, window: int) -> None:
        """No ping to the guest's programs (``XInput.processed``)."""
        return None

    def move(self, x: int, y: int) -> None:
        self._at(x, y)

    def button(self, button: int, press: bool) -> None:
        self._vm.send(self._btn(button, press))

    def click(self, x: int, y: int, button: int = 1, count: int = 1) -> None:
        self._at(x, y)
        for _ in range(count):
            self._vm.send(self._btn(button, True))
            self._vm.send(self._btn(button, False))

    def scroll(self, x: int, y: int, dx: int, dy: int) -> None:
        self._at(x, y)
        for amount, neg, pos in ((dy, "wheel-up", "wheel-down"), (dx, "wheel-left", "wheel-right")):
            for _ in range(abs(amount)):
                b = pos if amount > 0 else neg
                self._vm.send({"type": "btn", "data": {"down": True, "button": b}},
                              {"type": "btn", "data": {"down": False, "button": b}})

    def key_combo(self, keysyms: list[int]) -> None:
        codes: list[str] = []
        for sym in keysyms:
            code, shift = keysym_qcode(sym)
            if shift and "shift" not in codes:
                codes.append("shift")
            codes.append(code)
        self._vm.key(*codes)

    # QEMU's PS/2 keyboard holds 16 bytes the guest has not read yet and drops what comes on top (a character
    # is 2 bytes, 4 with shift). A guest vCPU that a loaded host holds off for a moment lost keys of a line
    # sent in one burst (CI: "echo hello > /root/greeting.txt" never made the file). A gap after every
    # character gives the guest 4 characters' worth (~80 ms) to catch up: 32 characters take ~0.6 s.
    key_gap_s = 0.02

    async def type_text(self, text: str) -> None:
        """Type ``text`` a character at a time, ``key_gap_s`` apart (awaited: the gym's other executions go
        on meanwhile)."""
        keys = [char_qcode(ch) for ch in text]   # all or nothing: refuse before the first key
        for i, (code, shift) in enumerate(keys):
            if i:
                await asyncio.sleep(self.key_gap_s)
            self._vm.key(*(("shift", code) if shift else (code,)))

    def reset_modifiers(self) -> None:
        self._vm.send(*({"type": "key", "data": {"down": False, "key": {"type": "qcode", "data": k}}}
                        for k in MODIFIERS))


class GuestFiles:
    """The validators' view of the guest's files (``validators.check``), through the guest agent. Relative
    paths are under the spec's ``guest_home``. The guest is the sandbox: no path is out of bounds."""

    def __init__(self, agent: GuestAgent, guest_os: str, home: str) -> None:
        self._agent, self._os, self._home = agent, guest_os, home
        self._path = ntpath if guest_os == "windows" else posixpath

    def path(self, rel: str) -> str:
        return self._path.join(self._home, rel)

    def parent(self, rel: str) -> str:
        return self._path.dirname(self.path(rel))

    def refuse(self, rel: str) -> str | None:
        return None

    def _run(self, linux: list[str], windows: list[str]) -> tuple[int, str]:
        code, out, _ = self._agent.exec(windows if self._os == "windows" else linux, timeout_s=30)
        return code, out.decode("utf-8", errors="replace")

    def kind(self, rel: str) -> str | None:
        p = self.path(rel)
        _, out = self._run(["/bin/sh", "-c", 'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; '
                            'elif [ -e "$1" ]; then echo other; fi', "sh", p],
                           ["cmd.exe", "/c", f'if exist "{p}\\*" (echo dir) else if exist "{p}" (echo file)'])
        return out.strip() or None

    def read(self, rel: str, limit: int) -> str | None:
        try:
            data = self._agent.read_file(self.path(rel), limit)
        except GuestAgentError:   # e.g. a folder: opens, cannot be read
            return None
        return None if data is None else data.decode("utf-8", errors="replace")

    def listdir(self, rel: str) -> list[str] | None:
        p = self.path(rel)
        code, out = self._run(["/bin/ls", "-A1", "--", p], ["cmd.exe", "/c", "dir", "/b", "/a", p])
        return [line.rstrip("\r") for line in out.splitlines() if line.strip()] if code == 0 else None

    def makedirs(self, *rels: str) -> None:
        """Make guest folders (and their parents) in one guest command."""
        paths = [self.path(r) for r in rels]
        if not paths:
            return
        code, out = self._run(["/bin/mkdir", "-p", "--", *paths],
                              ["cmd.exe", "/c", " & ".join(f'(if not exist "{p}" mkdir "{p}")' for p in paths)])
        if code != 0:
            raise RuntimeError(f"cannot make the guest folders {paths}: {out.strip()[-200:]}")

    def write(self, rel: str, text: str) -> None:
        """Create or replace a guest file (its folder must exist: ``makedirs``)."""
        self._agent.write_file(self.path(rel), text.encode())


# -- the desktop --------------------------------------------------------------------------------------------
class VMDesktop:
    """One execution's machine, resumed from its spec's template. The manager and the gym use it like
    ``Desktop``: ``start``, ``screen``, ``xinput``, ``files``, ``stop``."""

    uses_x = False        # the manager picks no X display for it
    device_type = "vm"
    home_mounted = True   # no host HOME for the reaper to poll: the guest's disk is its overlay

    def __init__(self, spec: VMDesktopSpec, machine: Machine, agent: GuestAgent) -> None:
        self.machine, self.agent = machine, agent
        self.layer: layers.Layer | None = None   # the frozen layer its overlay sits on (a fork's), held
        self.screen = VMScreen(machine)
        self.spec = replace(spec, width=self.screen.width, height=self.screen.height)
        self.xinput = VMInput(machine, self.spec.width, self.spec.height)
        self.files = GuestFiles(agent, spec.guest_os, spec.guest_home)
        self.display = f"vm:{machine.root.name}"
        self.display_num = -1

    @classmethod
    def start(cls, spec: VMDesktopSpec, *, display_num: int = -1, uid: int | None = None, workdir: Path,
              limits: SandboxLimits | None = None, timeout_s: float = 30.0, x=None) -> "VMDesktop":
        """Blocking, on a spawner thread: the template (booted once), then this execution's machine resumed
        from it. Raises (and leaves nothing) when the machine does not come up."""
        tpl = template_for(spec, workdir, timeout_s)
        vm = Machine.start(spec.vm, workdir=workdir, timeout_s=timeout_s, base=tpl.overlay, incoming=tpl.state)
        agent = None
        try:
            vm.wait_resumed(timeout_s)
            agent = _agent_of_resumed(vm, timeout_s)
            _set_clock(agent)
            return cls(spec, vm, agent)
        except BaseException as exc:
            # A resumed guest whose agent is silent while QEMU runs: the saved state itself may be bad (CI saw
            # three machines in a row from one template fail so), and every machine would resume it. The
            # manager's next attempt boots a new template instead.
            silent = (isinstance(exc, GuestAgentError) and agent is None and vm.proc is not None
                      and vm.proc.poll() is None)
            if agent is not None:
                agent.close()
            vm.stop()
            if silent and discard_template(spec, workdir, tpl):
                logger.warning("the guest agent of a machine resumed from the VM template did not answer (%s); "
                               "the next machine boots a new template", exc)
            raise

    def provision(self, files: dict[str, str], dirs: list[str], commands: list[list[str]]) -> None:
        """The task's set-up inside the guest: folders, files, then commands (each must exit 0)."""
        self.files.makedirs(*dirs, *sorted({self.files.parent(rel) for rel in files}))
        for rel, text in files.items():
            self.files.write(rel, text)
        for argv in commands:
            code, out, err = self.agent.exec(argv, timeout_s=60)
            if code != 0:
                raise RuntimeError(f"set-up command {argv[0]} exited {code}: "
                                   f"{(err or out).decode(errors='replace').strip()[-200:]}")

    def stop(self) -> None:
        self.agent.close()
        self.machine.stop()
        layer, self.layer = self.layer, None
        layers.release(layer)

    # -- forks: the whole machine frozen once, each child resumed from it -----------------------------------
    def freeze(self, workdir: Path) -> "Frozen":
        """Blocking. Pause the machine, take its screen, freeze its disk as a layer (it goes on writing to a new
        overlay over it), save its RAM and devices to a file, run it again. The parent is paused for the save
        (~0.7 s for the 256 MiB test guest under TCG) and otherwise untouched."""
        vm = self.machine
        folder = workdir / "vm-layers"
        folder.mkdir(mode=0o700, exist_ok=True)
        token = secrets.token_hex(4)
        vm.pause()
        try:
            frame = bytes(vm.screendump())
            layer = layers.freeze(vm.overlay, folder / f"{token}.qcow2", self.layer)
            try:
                vm.switch_disk(vm.root / f"overlay-{token}.qcow2", layer.path)
            except BaseException:
                layers.discard(layer)
                raise
            self.layer = layers.hold(layer, 2)   # this machine's hold, and the fork's until it is released
            frozen = Frozen(layer, folder / f"{token}.state", frame, self.spec)
            try:
                vm.save_state(frozen.state)
            except BaseException:
                frozen.release()
                raise
            return frozen
        finally:
            vm.resume()

    @classmethod
    def thaw(cls, frozen: "Frozen", workdir: Path, timeout_s: float) -> "VMDesktop":
        """Blocking, on a spawner thread: one child of ``frozen``, on an overlay of its own over the frozen disk.
        It loads paused; its screen must be the parent's frame byte for byte (else ``ForkRefused``); then it
        runs and its guest agent answers. Raises (and leaves nothing) when it does not come up."""
        vm = Machine.start(frozen.spec.vm, workdir=workdir, timeout_s=timeout_s, base=frozen.layer.path,
                           incoming=frozen.state)
        agent = None
        try:
            vm.wait_loaded(timeout_s)
            frame = bytes(vm.screendump())
            if frame != frozen.frame:
                w, h = frozen.spec.width, frozen.spec.height
                raise ForkRefused("a VM child's screen, loaded from the parent's saved state, is not the parent's: "
                                  + difference(frozen.frame, frame, w, h, []))
            vm.resume()
            agent = _agent_of_resumed(vm, timeout_s)
            _set_clock(agent)
            desk = cls(frozen.spec, vm, agent)
        except BaseException:
            if agent is not None:
                agent.close()
            vm.stop()
            raise
        desk.layer = layers.hold(frozen.layer)
        return desk


@dataclass
class Frozen:
    """A VM frozen for a fork: its disk layer, its saved RAM and devices, its screen then (PPM) and its spec.
    ``release`` once every child has loaded (the state file is deleted; the layer lives on in its users)."""

    layer: layers.Layer
    state: Path
    frame: bytes
    spec: VMDesktopSpec

    def release(self) -> None:
        self.state.unlink(missing_ok=True)
        layer, self.layer = self.layer, None
        layers.release(layer)


def _agent_of_resumed(vm: Machine, timeout_s: float) -> GuestAgent:
    """The guest agent of a machine resumed from a saved state. A first connection unanswered in ``timeout_s`` gets
    one more chance on a new connection (at most ``RECONNECT_S``): QEMU then tells the guest again that the host
    side opened, which a guest that missed it would answer. Either way the outcome says what happened, so a silent
    guest names its cause next time (CI saw a resumed guest stay silent twice; not reproduced since)."""
    alive = lambda: vm.proc is not None and vm.proc.poll() is None  # noqa: E731
    try:
        return GuestAgent.connect(str(vm.agent_socket), timeout_s, alive)
    except GuestAgentError as first:
        if not alive():
            raise
        wait_s = min(RECONNECT_S, timeout_s)
        try:
            agent = GuestAgent.connect(str(vm.agent_socket), wait_s, alive)
        except GuestAgentError as again:
            raise GuestAgentError(f"{first}, nor on a new connection within {wait_s:.0f} s "
                                  f"({_liveness(vm)})") from again
    logger.warning("the guest agent of VM %s answered only on a new connection, not on the first within %.0f s",
                   vm.root.name, timeout_s)
    return agent


def _liveness(vm: Machine) -> str:
    """What a silent guest still does, for a message: QEMU's run state, whether its screen changes after a space key
    (a shell echoes it: a guest whose kernel runs), what the guest last wrote to its serial port (the test guest's
    agent logs every request it reads there), and where its screen and logs are kept (the machine is discarded
    afterwards)."""
    try:
        status, before = vm.status(), vm.screendump()
        vm.key("spc")
        time.sleep(2.0)
        moved = vm.screendump() != before
        said = f"QEMU {status}; the screen {'changed' if moved else 'did not change'} after a key"
    except (OSError, QMPError) as exc:
        said = f"QEMU did not say: {exc}"
    serial = vm.log_tail(600, "serial.log")
    said += f"; its serial port's last output: {serial!r}" if serial else "; nothing on its serial port"
    kept = _keep_silent(vm)
    return said + (f"; its screen and logs are kept in {kept}" if kept else "")


def _keep_silent(vm: Machine) -> Path | None:
    """A copy of a silent machine's screen (PNG) and QEMU's logs in a new folder of ``SILENT_KEPT`` (older folders
    beyond ``SILENT_KEEP`` deleted); None when it could not be made."""
    try:
        SILENT_KEPT.mkdir(mode=0o700, exist_ok=True)
        for old in sorted(SILENT_KEPT.iterdir())[:-(SILENT_KEEP - 1)]:
            shutil.rmtree(old, ignore_errors=True)
        folder = SILENT_KEPT / f"{time.strftime('%Y%m%d-%H%M%S')}-{vm.root.name}"
        folder.mkdir()
        for name in ("qemu.log", "serial.log"):
            if (vm.root / name).is_file():
                shutil.copy(vm.root / name, folder / name)
        (folder / "screen.png").write_bytes(vm.screenshot_png())
        return folder
    except (OSError, QMPError) as exc:
        logger.warning("could not keep the silent VM %s's screen and logs: %s", vm.root.name, exc)
        return None


def _set_clock(agent: GuestAgent) -> None:
    """The resumed guest's clock lags by about the time since its template was saved (measured: 2.3 s after
    8 s); set it to now. Linux guests' qemu-ga needs /sbin/hwclock for this (else "unsupported": logged)."""
    try:
        agent.set_time()
    except (GuestAgentError, QMPError) as exc:
        logger.debug("guest clock not set: %s", exc)
