"""One QEMU virtual machine for one execution: a copy-on-write overlay on the user's base image, seen and
driven through QEMU's own machine protocol (no agent in the guest needed to see or act).

- Disk: ``qemu-img create -f qcow2 -b BASE -F FMT overlay.qcow2`` in the machine's own folder; the base is
  opened read-only through the overlay and never written; the folder (overlay, sockets, log) is deleted
  when the machine stops.
- Screen: QMP ``screendump`` (PPM or PNG, the guest's current resolution). Input: QMP ``input-send-event`` with a
  USB tablet, so pointer positions are absolute (0..1 of the screen, like the X11 desktops' actions).
- Acceleration: KVM where it starts, else TCG (``-accel kvm -accel tcg``: QEMU takes the first that starts;
  ``VMSpec.accel`` changes the order); ``Machine.accel`` reports which one runs.
- Lifetime: started from a ``procs.Spawner`` thread like the X11 desktops, so the kernel kills QEMU when the
  gym dies (parent-death signal), and ``stop`` quits it, kills what is left and deletes its folder.

- Saved states: ``save_state`` writes the running machine (RAM and devices; the disk is flushed to its
  overlay) to a file, and ``start(incoming=...)`` resumes another machine from it, on an overlay over the
  saved machine's own overlay (``base=``). That is how the gym's VM desktops start without booting
  (``backend.py``). ``save_snapshot``/``load_snapshot`` keep internal snapshots inside one overlay (a reset
  of a running machine).
- Forks: ``pause``, ``switch_disk`` (the machine goes on writing to a new overlay over its old one, which is
  frozen from then on), ``save_state``, ``resume``; the children start with ``incoming`` on overlays over the
  frozen one and ``wait_loaded`` (they load paused, as the parent was saved; ``backend.VMDesktop.freeze``).
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import procs
from .qmp import QMP, QMPError

logger = logging.getLogger(__name__)

TABLET_MAX = 0x7FFF   # the USB tablet's axis range (input-send-event "abs" values)


@dataclass(frozen=True)
class VMSpec:
    base_image: str | None = None   # the user's disk image (qcow2, raw, ...); None: no disk (firmware only)
    memory_mib: int = 1024
    cpus: int = 1
    kernel: str | None = None       # boot this Linux kernel directly (with ``initrd`` and ``append``)
    initrd: str | None = None
    append: str = ""
    # accelerators in order of preference: QEMU takes the first that starts. A KVM that starts is not
    # always one a guest kernel boots on (this development machine's nested KVM runs the firmware but not
    # Linux), so a backend that knows better names ("tcg",).
    accel: tuple[str, ...] = ("kvm", "tcg")


@dataclass
class Machine:
    spec: VMSpec
    root: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    qmp: QMP | None = field(default=None, repr=False)
    accel: str = ""
    disk: Path | None = None   # the overlay the machine writes, once a fork moved it off ``root/overlay.qcow2``

    @property
    def overlay(self) -> Path:
        return self.disk or self.root / "overlay.qcow2"

    # -- start --------------------------------------------------------------------------------------
    @property
    def agent_socket(self) -> Path:
        return self.root / "qga.sock"

    @classmethod
    def start(cls, spec: VMSpec, *, workdir: Path, timeout_s: float = 30.0, base: Path | None = None,
              incoming: Path | None = None) -> "Machine":
        """Blocking (call from a ``procs.Spawner`` thread): overlay, QEMU, QMP connected.

        ``base``: the overlay's backing file instead of ``spec.base_image`` (a saved machine's overlay).
        ``incoming``: resume from this ``save_state`` file instead of booting (QEMU runs the guest once it
        is loaded; ``wait_resumed``)."""
        vm = cls(spec=spec, root=workdir / f"vm-{secrets.token_hex(4)}")
        try:
            vm.root.mkdir(mode=0o700)
            base = base or (Path(spec.base_image) if spec.base_image is not None else None)
            if base is not None:
                vm._make_overlay(base)
            vm._start_qemu(timeout_s, incoming)
        except BaseException:
            vm.stop()
            raise
        return vm

    def _make_overlay(self, base: Path) -> None:
        base = base.resolve()
        if not base.is_file():
            raise FileNotFoundError(f"VM base image {base} does not exist")
        info = subprocess.run(["qemu-img", "info", "--output=json", str(base)], capture_output=True, text=True,
                              timeout=30)
        if info.returncode != 0:
            raise RuntimeError(f"qemu-img cannot read {base}: {info.stderr.strip()[-300:]}")
        fmt = json.loads(info.stdout)["format"]
        made = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", fmt,
                               str(self.overlay)], capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            raise RuntimeError(f"qemu-img could not create an overlay on {base}: {made.stderr.strip()[-300:]}")

    def argv(self) -> list[str]:
        qmp_sock = self.root / "qmp.sock"
        argv = ["qemu-system-x86_64", "-nodefaults", "-no-user-config",
                *(a for name in self.spec.accel for a in ("-accel", name)),
                "-m", str(self.spec.memory_mib), "-smp", str(self.spec.cpus), "-vga", "std", "-display", "none",
                # a VNC server without a listener: a live view opens it on a loopback port (open_vnc)
                "-vnc", "none",
                "-qmp", f"unix:{qmp_sock},server=on,wait=off", "-usb", "-device", "usb-tablet",
                "-nic", "none", "-serial", f"file:{self.root / 'serial.log'}"]
        if self.overlay.exists():
            argv += ["-drive", f"file={self.overlay},format=qcow2,if=virtio,cache=unsafe"]
        if self.spec.kernel is not None:
            argv += ["-kernel", self.spec.kernel, "-append", self.spec.append,
                     *(["-initrd", self.spec.initrd] if self.spec.initrd else [])]
        # the guest agent's channel (files and commands inside the guest, when the guest runs qemu-ga)
        argv += ["-device", "virtio-serial", "-chardev",
                 f"socket,path={self.root / 'qga.sock'},server=on,wait=off,id=qga0",
                 "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]
        return argv

    def open_vnc(self, port: int) -> None:
        """QEMU's VNC server listening on 127.0.0.1:``port`` (the live view's; without a password: loopback only)."""
        if self.qmp is None:
            raise QMPError("the machine is not running")
        self.qmp.execute("display-update", type="vnc", addresses=[{"type": "inet", "host": "127.0.0.1",
                                                                   "port": str(port)}])

    def _start_qemu(self, timeout_s: float, incoming: Path | None = None) -> None:
        argv = self.argv() + (["-incoming", f"exec:cat {shlex.quote(str(incoming))}"] if incoming else [])
        with open(self.root / "qemu.log", "wb") as log:
            self.proc = procs.popen(argv, stdout=log, stderr=log, cwd=str(self.root))
        try:
            self.qmp = QMP.connect(str(self.root / "qmp.sock"), timeout_s, alive=lambda: self.proc.poll() is None)
        except (OSError, QMPError) as exc:
            raise RuntimeError(f"QEMU did not start (exit {self.proc.poll()}): {exc}; it said: "
                               f"{self.log_tail(500)}") from exc
        self.accel = "kvm" if (self.qmp.execute("query-kvm") or {}).get("enabled") else "tcg"
        logger.info("VM %s up (%s, pid %d)", self.root.name, self.accel, self.proc.pid)

    # -- see and act --------------------------------------------------------------------------------
    def screendump(self, fmt: str = "ppm") -> bytes:
        """The screen now, as QEMU writes it: ``ppm`` (a header, then RGB; cheapest) or ``png``."""
        path = self.root / f"shot-{secrets.token_hex(4)}.{fmt}"
        try:
            self.qmp.execute("screendump", filename=str(path), format=fmt)
            return path.read_bytes()
        finally:
            path.unlink(missing_ok=True)

    def screenshot_png(self) -> bytes:
        return self.screendump("png")

    def send(self, *events: dict) -> None:
        self.qmp.execute("input-send-event", events=list(events))

    def key(self, *qcodes: str) -> None:
        """Press the keys in order and release them in reverse (a combination such as ctrl, alt, delete), in
        one QMP command: the guest gets the releases queued behind the presses. Sent as two commands, a
        loaded host could hold the release back past the guest's autorepeat delay (250 ms on a Linux
        console), and the guest typed the key again ("hhello": seen in CI under load)."""
        down = [{"type": "key", "data": {"down": True, "key": {"type": "qcode", "data": k}}} for k in qcodes]
        up = [{"type": "key", "data": {"down": False, "key": {"type": "qcode", "data": k}}}
              for k in reversed(qcodes)]
        self.send(*down, *up)

    def move(self, x: float, y: float) -> None:
        """Pointer to (x, y), fractions of the screen."""
        self.send({"type": "abs", "data": {"axis": "x", "value": round(x * TABLET_MAX)}},
                  {"type": "abs", "data": {"axis": "y", "value": round(y * TABLET_MAX)}})

    def click(self, x: float, y: float, button: str = "left") -> None:
        self.move(x, y)
        self.send({"type": "btn", "data": {"down": True, "button": button}})
        self.send({"type": "btn", "data": {"down": False, "button": button}})

    # -- saved states -------------------------------------------------------------------------------
    def wait_resumed(self, timeout_s: float) -> None:
        """Wait until a machine started with ``incoming`` has loaded the state and runs."""
        deadline = time.monotonic() + timeout_s
        while (status := self.status()) != "running":
            if status not in ("inmigrate", "prelaunch", "paused", "restore-vm") or time.monotonic() > deadline:
                raise RuntimeError(f"VM {self.root.name} did not resume from its saved state (status {status!r}; "
                                   f"QEMU said: {self.log_tail()})")
            time.sleep(0.01)

    def save_state(self, path: Path, timeout_s: float = 120.0) -> None:
        """Write the machine's RAM and device state to ``path`` (the disk is flushed to the overlay first);
        the machine is paused afterwards and its overlay must not change again: it backs the resumed ones."""
        self.qmp.execute("migrate", uri=f"exec:cat > {shlex.quote(str(path))}")
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.qmp.execute("query-migrate") or {}
            if info.get("status") == "completed":
                return
            if info.get("status") in ("failed", "cancelled") or time.monotonic() > deadline:
                raise RuntimeError(f"saving VM state failed: {info.get('status')} {info.get('error-desc', '')}")
            time.sleep(0.02)

    def log_tail(self, n: int = 400, name: str = "qemu.log") -> str:
        """The last ``n`` characters of QEMU's log (``name="serial.log"``: what the guest wrote to its serial port)."""
        try:
            return (self.root / name).read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""

    def save_snapshot(self, name: str) -> None:
        """Save the whole machine (RAM, devices, disk) as internal snapshot ``name`` of the overlay."""
        self._hmp_ok(f"savevm {name}")

    def load_snapshot(self, name: str) -> None:
        """Put the machine back to snapshot ``name`` (a reset without a boot)."""
        self._hmp_ok(f"loadvm {name}")

    def _hmp_ok(self, line: str) -> None:
        if not self.overlay.exists():
            raise QMPError(f"{line}: the machine has no disk to keep snapshots in")
        out = self.qmp.hmp(line).strip()
        if out:   # savevm and loadvm print nothing when they succeed
            raise QMPError(f"{line}: {out}")

    def status(self) -> str:
        return (self.qmp.execute("query-status") or {}).get("status", "")

    # -- forks (backend.VMDesktop.freeze/thaw) ----------------------------------------------------------
    def pause(self) -> None:
        self.qmp.execute("stop")

    def resume(self) -> None:
        """Run again: after ``pause``, or after ``save_state`` (QEMU takes its disks back and goes on)."""
        self.qmp.execute("cont")

    def wait_loaded(self, timeout_s: float) -> str:
        """Wait until a machine started with ``incoming`` has loaded its state: its status then (``paused``
        when the saved machine was paused, as a fork's is)."""
        deadline = time.monotonic() + timeout_s
        while (status := self.status()) in ("inmigrate", "prelaunch", "restore-vm"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"VM {self.root.name} did not load its saved state (status {status!r}; QEMU said: "
                                   f"{self.log_tail()})")
            time.sleep(0.01)
        return status

    def switch_disk(self, new: Path, backing: Path) -> None:
        """From now on write to a new overlay ``new`` whose backing file is ``backing`` (a link to the overlay the
        machine wrote so far, which no one writes again): QMP ``blockdev-snapshot-sync`` in ``existing`` mode, so
        the new overlay's header names ``backing`` (not the old overlay's own path). Pause the machine first."""
        block = self.qmp.execute("query-block") or []
        device = next((b for b in block if b.get("inserted")), None)
        if device is None:
            raise QMPError("the machine has no disk")
        size = device["inserted"]["image"]["virtual-size"]
        made = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", str(backing), "-F", "qcow2",
                               str(new), str(size)], capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            raise RuntimeError(f"qemu-img could not create an overlay on {backing}: {made.stderr.strip()[-300:]}")
        self.qmp.execute("blockdev-snapshot-sync", device=device["device"], **{"snapshot-file": str(new)},
                         format="qcow2", mode="existing")
        self.disk = new

    # -- stop ---------------------------------------------------------------------------------------
    def stop(self, keep_files: bool = False) -> None:
        """Quit QEMU (kill it if it does not go), then delete the overlay, sockets and log (unless
        ``keep_files``: a saved machine whose overlay backs others)."""
        if self.qmp is not None:
            try:
                self.qmp.execute("quit")
            except (OSError, QMPError):
                pass
            self.qmp.close()
            self.qmp = None
        if self.proc is not None:
            try:
                self.proc.wait(3.0)
            except subprocess.TimeoutExpired:
                pass
            procs.kill_group(self.proc)
            self.proc = None
        if not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)


def wait_for_screen(vm: Machine, pred, timeout_s: float, interval_s: float = 0.2) -> bytes | None:
    """Screenshots until ``pred(png)`` holds; the matching one, or None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        png = vm.screenshot_png()
        if pred(png):
            return png
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)
