"""One desktop: a private Xvfb display, openbox, and the task's apps in a bubblewrap sandbox.

Isolation (docs/local_gym.md, "Desktops and the sandbox"): apps run as a per-slot unprivileged uid, in new
user/pid/net/ipc/uts namespaces, see only read-only /usr and the parts of /etc the apps read (``SANDBOX_ETC``), a fresh
HOME made from the task's files (a size-capped tmpfs when the gym is root: ``mounts``), a small tmpfs /tmp,
their own D-Bus session and only their own display's socket, which lets in only who presents its cookie
(``xauth``; the apps as *untrusted* X clients, ``Desktop.untrusted_apps``). Process and file-size
rlimits cap fork bombs and disk fills. Nothing is ever reused between executions: a desktop is built for one
execution and destroyed with it, so no X state (Caps Lock, pointer, clipboard) can leak.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import secrets
import select
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from Xlib import X, display as xdisplay, error as xerror

from . import mounts, procs, xauth
from .apps import APPS, app_command
from .home_paths import home_file_parts
from .screen import Screen
from .validators import HomeFiles
from .xinput import XInput

logger = logging.getLogger(__name__)

SANDBOX_HOME = "/home/user"
SANDBOX_XAUTHORITY = "/tmp/.Xauthority"   # the apps' cookie (read-only; ``Desktop.apps_xauth_file``)
# What of the host's /etc the sandbox sees (read-only; missing ones are skipped): the dynamic linker, fonts,
# GTK/X11/XDG settings, D-Bus's session config, the alternatives symlinks (``/usr/bin/x-*``), Chromium's
# launcher settings, terminal and MIME data, the time zone. Never the host's accounts (passwd and group are
# generated per desktop), SSH, sudo, PAM or package manager settings.
SANDBOX_ETC = ("X11", "alternatives", "bash.bashrc", "ca-certificates", "chromium", "chromium.d", "dbus-1",
               "dconf", "fonts", "glvnd", "gtk-2.0", "gtk-3.0", "host.conf", "hosts", "inputrc", "ld.so.cache",
               "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime", "magic", "magic.mime", "machine-id",
               "mime.types", "nsswitch.conf", "os-release", "shells", "ssl", "terminfo", "timezone", "xdg")
OPENBOX_RC = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <focus><focusNew>yes</focusNew><followMouse>no</followMouse></focus>
  <placement><policy>Smart</policy></placement>
  <desktops><number>1</number></desktops>
  <keyboard><keybind key="A-Tab"><action name="NextWindow"/></keybind></keyboard>
  <applications>
{rules}
  </applications>
</openbox_config>
"""


@dataclass(frozen=True)
class AppLaunch:
    name: str
    args: tuple[str, ...] = ()
    # fractions of the screen (x, y, w, h); None = maximised
    geometry: tuple[float, float, float, float] | None = None


@dataclass(frozen=True)
class DesktopSpec:
    """Everything that decides how a desktop looks when it is handed out (the pool key)."""

    apps: tuple[AppLaunch, ...]
    files: tuple[tuple[str, str], ...] = ()      # (path relative to HOME, text content)
    dirs: tuple[str, ...] = ()
    width: int = 1280
    height: int = 800

    @property
    def desktop_class(self) -> type["Desktop"]:
        """The class the manager builds this spec with (``BrowserSpec`` and ``VMDesktopSpec`` name theirs)."""
        return Desktop


@dataclass(frozen=True)
class SandboxLimits:
    nproc: int = 256            # per uid (one uid per slot)
    fsize_bytes: int = 64 << 20  # largest file an app may write
    tmp_bytes: int = 64 << 20    # size of the sandbox's tmpfs /tmp
    nofile: int = 4096
    home_bytes: int = 256 << 20  # HOME quota: the size of HOME's tmpfs (root), else the reaper's polled limit


# Every HOME starts with these settings. Text carets that do not blink (GTK 3 and 2; the board's Tk entries set
# -insertofftime 0): a blinking caret makes a still desktop give two different screenshots, reports "screen
# changed" after actions that changed nothing, and costs an idle editor ~4 ms of CPU a second. And no bell (GTK's
# error bell, readline's): the X server refuses untrusted clients (``Desktop.untrusted_apps``) the Bell request, and
# GTK and xterm exit on that refusal (mousepad quit at Ctrl+Home at the top of its document; xterm's own bell is a
# visual one of no duration, apps.py).
STILL_CARETS = ((".config/gtk-3.0/settings.ini", "[Settings]\ngtk-cursor-blink = false\ngtk-error-bell = false\n"),
                (".gtkrc-2.0", "gtk-cursor-blink = 0\ngtk-error-bell = 0\n"),
                (".inputrc", "$include /etc/inputrc\nset bell-style none\n"))


def _openbox_rules(spec: DesktopSpec) -> str:
    rules = []
    for app in spec.apps:
        cls = APPS[app.name].wm_class
        if app.geometry is None:
            body = "<maximized>yes</maximized>"
        else:
            fx, fy, fw, fh = app.geometry
            x, y = int(fx * spec.width), int(fy * spec.height)
            w, h = int(fw * spec.width), int(fh * spec.height)
            body = (f"<decor>no</decor><position force=\"yes\"><x>{x}</x><y>{y}</y></position>"
                    f"<size><width>{w}</width><height>{h}</height></size>")
        rules.append(f'    <application class="{cls}" type="normal">{body}</application>')
    return "\n".join(rules)


def _read_line(fd: int, timeout_s: float) -> str:
    """Read up to a newline; Xvfb writes the number and the newline separately and dies on EPIPE."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 64) if ready else b""
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def _windows_now(d, root, client_list) -> str:
    """What the X server holds when apps did not map: the windows the window manager took (its client list) and
    the ones with a class it did not (children of the root, not reparented into a frame), each viewable or not,
    so a failed start tells an app that made no window from one the window manager never took."""
    def described(win) -> str | None:
        cls = win.get_wm_class()
        if not cls:
            return None
        return f"{cls[1]} {'viewable' if win.get_attributes().map_state == X.IsViewable else 'unmapped'}"

    try:
        prop = root.get_full_property(client_list, X.AnyPropertyType)
        clients = list(prop.value) if prop else []   # in the order the window manager took them
        managed, unmanaged = [], []
        for wid in clients:
            with contextlib.suppress(xerror.XError):
                managed.append(described(d.create_resource_object("window", wid)) or "no class")
        for win in root.query_tree().children:
            with contextlib.suppress(xerror.XError):
                if win.id not in clients and (text := described(win)):
                    unmanaged.append(text)
        return (f"managed: {', '.join(managed) or 'none'}; not managed: {', '.join(unmanaged) or 'none'}")
    except Exception as exc:  # noqa: BLE001 - a description of a failure must not hide it
        return f"windows unknown: {type(exc).__name__}"


def _tasks_of_uid(uid: int) -> int:
    """Processes and threads owned by ``uid`` (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}")
                if st.st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def _rlimits(limits: SandboxLimits, uid: int):
    # RLIMIT_NPROC counts every task of the real uid. As root each slot has a uid of its own; otherwise
    # the sandbox shares the server's uid, so the cap is "what runs now + nproc".
    nproc = limits.nproc if os.geteuid() == 0 else _tasks_of_uid(uid) + limits.nproc

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_bytes, limits.fsize_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
    return apply


@dataclass
class Desktop:
    """A running desktop. Create with ``Desktop.start`` (blocking, call from a ``procs.Spawner`` thread)."""

    spec: DesktopSpec
    display_num: int
    uid: int
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    xinput: XInput | None = field(default=None, repr=False)
    screen: Screen | None = field(default=None, repr=False)
    started_s: float = 0.0
    home_mounted: bool = False   # HOME is a tmpfs of the quota's size (else only the reaper limits it)
    stop_errors: list[str] = field(default_factory=list, repr=False)   # what ``stop`` could not do (logged too)
    uses_x = True                # (a class fact: VM desktops have none, vm/backend.py)
    # Whether the apps connect as untrusted X clients (xauth.py): then they cannot kill, read or draw on the gym's
    # connections (issue 80). What they lose is made up for: their _NET_WM_PING answers, which the X server drops,
    # are read through RECORD (xinput.py), and bells, which it refuses, are off (``STILL_CARETS``, apps.py).
    # ``BrowserDesktop`` keeps Chromium trusted (browser.py says why).
    untrusted_apps = True

    @property
    def display(self) -> str:
        return f":{self.display_num}"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def xauth_file(self) -> Path:
        """The display's trusted cookie (Xvfb's ``-auth``; the window manager and the live view present it): in the
        desktop's root folder, which the sandbox never sees."""
        return self.root / "xauth"

    @property
    def apps_xauth_file(self) -> Path:
        """The cookie the sandboxed apps present (``_authorize_apps``)."""
        return self.root / "apps.xauth"

    @property
    def files(self):
        """What the validators read: this desktop's HOME (``validators.HomeFiles``)."""
        return HomeFiles(self.home)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def home_usage(self, cap: int) -> int:
        """Bytes under HOME (stops counting past ``cap``); symlinks are not followed."""
        total, todo = 0, [str(self.home)]
        while todo and total <= cap:
            try:
                with os.scandir(todo.pop()) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
        return total

    # -- start --------------------------------------------------------------------------------------
    @classmethod
    def start_x(cls, *, width: int, height: int, display_num: int, uid: int, workdir: Path,
                timeout_s: float = 20.0) -> "Desktop":
        """Only the X server of a future desktop (a pre-started one: ``start(..., x=)`` builds on it).

        Blocking, from a ``procs.Spawner`` thread. No client has connected to it yet, so it is as fresh as
        one started with the desktop; it saves the ~70 ms of Xvfb's start-up from a cold create.
        """
        desk = cls(spec=DesktopSpec(apps=(), width=width, height=height), display_num=display_num, uid=uid,
                   root=workdir / f"d{display_num}-{secrets.token_hex(4)}")
        try:
            desk._make_root()
            desk._start_xvfb(timeout_s)
        except BaseException:
            desk.stop()
            raise
        return desk

    @classmethod
    def start(cls, spec: DesktopSpec, *, display_num: int, uid: int, workdir: Path,
              limits: SandboxLimits = SandboxLimits(), timeout_s: float = 20.0,
              x: "Desktop | None" = None) -> "Desktop":
        """Build the desktop; on ``x`` (from ``start_x``, same size; it becomes this desktop's) when given."""
        t0 = time.monotonic()
        if x is None:   # cleans up after itself when it fails
            x = cls.start_x(width=spec.width, height=spec.height, display_num=display_num, uid=uid,
                            workdir=workdir, timeout_s=timeout_s)
        elif (x.spec.width, x.spec.height) != (spec.width, spec.height):
            raise ValueError(f"X server {x.display} is {x.spec.width}x{x.spec.height}, the desktop "
                             f"{spec.width}x{spec.height}")
        desk = cls(spec=spec, display_num=x.display_num, uid=x.uid, root=x.root, procs=x.procs)
        try:
            desk._prepare_dirs(limits)
            # The apps start once openbox manages the screen (its _NET_SUPPORTING_WM_CHECK is set after it
            # redirects the root's map requests). Started beside it (saving ~40 ms), a window mapped while
            # openbox was starting under load was sometimes never managed: the board stayed Tk's 200x200 in
            # the corner of a black screen, unmaximised, for the whole episode (a tree run and the curriculum
            # test, 2026-11-30; curriculum.show now refuses such a board).
            openbox = desk._spawn_openbox()
            desk._wait_openbox(openbox, timeout_s)
            desk._authorize_apps()
            desk._start_sandbox(limits)
            desk._wait_for_windows(timeout_s)
            desk.xinput = XInput(desk.display)
            desk.screen = Screen(desk.display)
            # the windows are mapped and drawn: 50 ms of identical frames (grabs 10 ms apart) is settled
            desk.screen.wait_stable(stable_s=0.05, timeout_s=3.0)
        except BaseException:
            desk.stop()
            raise
        desk.started_s = time.monotonic() - t0
        logger.info("desktop %s up in %.0f ms (uid %d)", desk.display, desk.started_s * 1e3, uid)
        return desk

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.uid)

    def _make_root(self) -> None:
        self.root.mkdir(mode=0o700)
        self._own(self.root)

    def _prepare_dirs(self, limits: SandboxLimits) -> None:
        home = self.home
        home.mkdir(mode=0o700)
        # before any file is written: the task's files count against the quota
        self.home_mounted = mounts.mount_home(home, limits.home_bytes, self.uid)
        # (TaskDef refused paths outside HOME when it loaded; the same rule again here, for specs made otherwise)
        for d in self.spec.dirs:
            home.joinpath(*home_file_parts(d)).mkdir(parents=True, exist_ok=True)
        for rel, text in (*STILL_CARETS, *self.spec.files):  # a task's own files come last and win
            path = home.joinpath(*home_file_parts(rel))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (self.root / "wm").mkdir()
        (self.root / "rc.xml").write_text(OPENBOX_RC.format(rules=_openbox_rules(self.spec)))
        (self.root / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\n"
                                          f"user:x:{self.uid}:{self.uid}:user:{SANDBOX_HOME}:/bin/bash\n")
        (self.root / "group").write_text(f"root:x:0:\nuser:x:{self.uid}:\n")
        if os.geteuid() == 0:
            for dirpath, dirnames, filenames in os.walk(self.root):
                for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                    os.chown(name, self.uid, self.uid)

    def _start_xvfb(self, timeout_s: float) -> None:
        # Xvfb compiles its keymap to /tmp/server-<display>.xkm. One killed before it removed the file leaves
        # it owned by its uid, and a later Xvfb on this display under another uid cannot write it (sticky
        # /tmp): "Keyboard initialization failed", and the X server exits. No X server holds this display now.
        with contextlib.suppress(OSError):
            os.unlink(f"/tmp/server-{self.display_num}.xkm")
        # Only those who present this display's cookie get in, as trusted clients: the gym (its process's
        # authority, xauth.gym_authority), openbox and the live view (``xauth_file``); the apps their own
        # (``_authorize_apps``).
        cookie = xauth.new_cookie()
        xauth.display_file(self.xauth_file, self.display_num, cookie, self.uid)
        xauth.gym_authority().add(self.display_num, cookie)
        r, w = os.pipe()
        try:
            argv = ["Xvfb", self.display, "-screen", "0", f"{self.spec.width}x{self.spec.height}x24",
                    "-nolisten", "tcp", "-displayfd", str(w), "-noreset", "-auth", str(self.xauth_file)]
            with open(self.root / "xvfb.log", "wb") as log:
                proc = procs.popen(argv, uid=self.uid, pass_fds=(w,), env={"PATH": os.environ.get("PATH", "")},
                                   stdout=log, stderr=log)
            self.procs.append(proc)
            os.close(w)
            w = -1
            got = _read_line(r, timeout_s)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        if got != str(self.display_num):
            tail = (self.root / "xvfb.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"Xvfb {self.display} did not start (exit {proc.poll()}, said {got!r}): {tail}")

    def _env(self, **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "DISPLAY": self.display, "LANG": "C.UTF-8",
                "XAUTHORITY": str(self.xauth_file), **extra}

    def _spawn_openbox(self) -> subprocess.Popen:
        proc = procs.popen(["openbox", "--config-file", str(self.root / "rc.xml")], uid=self.uid,
                           env=self._env(HOME=str(self.root / "wm")))
        self.procs.append(proc)
        return proc

    def _wait_openbox(self, proc: subprocess.Popen, timeout_s: float) -> None:
        try:
            d = xdisplay.Display(self.display)
        except Exception as exc:
            tail = (self.root / "xvfb.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"cannot connect to {self.display} (Xvfb exit {self.procs[0].poll()}): {exc}; "
                               f"Xvfb said: {tail}") from exc
        try:
            atom = d.intern_atom("_NET_SUPPORTING_WM_CHECK")
            ok = procs.wait_until(lambda: d.screen().root.get_full_property(atom, X.AnyPropertyType) is not None,
                                  timeout_s, 0.005)
        finally:
            d.close()
        if not ok:
            raise RuntimeError(f"openbox on {self.display} did not start (exit {proc.poll()})")

    def _authorize_apps(self) -> None:
        """The cookie the sandboxed apps connect with: generated by the X server as an untrusted one (xauth.py), or
        the display's own where ``untrusted_apps`` is off."""
        if not self.untrusted_apps:
            shutil.copyfile(self.xauth_file, self.apps_xauth_file)
            self._own(self.apps_xauth_file)
            return
        d = xdisplay.Display(self.display)
        try:
            cookie = xauth.untrusted_cookie(d)
        finally:
            d.close()
        xauth.display_file(self.apps_xauth_file, self.display_num, cookie, self.uid)

    def bwrap_argv(self, limits: SandboxLimits, command: list[str] | None = None) -> list[str]:
        """The sandbox command line; ``command`` (run inside) defaults to the spec's apps in a D-Bus session."""
        sock = f"/tmp/.X11-unix/X{self.display_num}"
        if command is None:
            # every app in the background, then wait: the sandbox lives while any app does
            apps = " ".join(app_command(a.name, list(a.args)) + " &" for a in self.spec.apps)
            command = ["dbus-run-session", "--", "/bin/sh", "-c", f"cd {SANDBOX_HOME}; {apps} wait"]
        env = {"HOME": SANDBOX_HOME, "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "DISPLAY": self.display, "LANG": "C.UTF-8",
               "GSETTINGS_BACKEND": "keyfile", "NO_AT_BRIDGE": "1", "GTK_OVERLAY_SCROLLING": "0",
               "XDG_RUNTIME_DIR": "/tmp/runtime", "TERM": "xterm", "XAUTHORITY": SANDBOX_XAUTHORITY}
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "desktop",
                "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
                "--dir", "/etc", *(a for n in SANDBOX_ETC for a in ("--ro-bind-try", f"/etc/{n}", f"/etc/{n}")),
                "--ro-bind", str(self.root / "passwd"), "/etc/passwd",
                "--ro-bind", str(self.root / "group"), "/etc/group",
                "--ro-bind-try", "/var/cache/fontconfig", "/var/cache/fontconfig",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
                "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
                "--dir", "/tmp/.X11-unix", "--bind", sock, sock,
                "--ro-bind", str(self.apps_xauth_file), SANDBOX_XAUTHORITY,
                "--dir", "/tmp/runtime",
                "--bind", str(self.home), SANDBOX_HOME, "--chdir", SANDBOX_HOME, "--clearenv"]
        for k, v in env.items():
            argv += ["--setenv", k, v]
        return argv + ["--", *command]

    def _start_sandbox(self, limits: SandboxLimits) -> None:
        argv = self.bwrap_argv(limits)
        logger.debug("sandbox %s: %s", self.display, shlex.join(argv))
        log = open(self.root / "apps.log", "wb")
        try:
            proc = procs.popen(argv, uid=self.uid, env={"PATH": "/usr/bin:/bin"}, stdout=log, stderr=log,
                               cwd=str(self.root), preexec=_rlimits(limits, self.uid))
        finally:
            log.close()
        self.procs.append(proc)

    def _wait_for_windows(self, timeout_s: float) -> None:
        want = {APPS[a.name].wm_class for a in self.spec.apps}
        d = xdisplay.Display(self.display)
        try:
            client_list = d.intern_atom("_NET_CLIENT_LIST")
            root = d.screen().root

            def mapped() -> bool:
                prop = root.get_full_property(client_list, X.AnyPropertyType)
                seen = set()
                for wid in (prop.value if prop else []):
                    try:
                        win = d.create_resource_object("window", wid)
                        cls = win.get_wm_class()
                        if cls and win.get_attributes().map_state == X.IsViewable:
                            seen.add(cls[1])
                    except xerror.XError:
                        continue
                return want <= seen

            if not procs.wait_until(mapped, timeout_s, 0.01):
                tail = (self.root / "apps.log").read_text(errors="replace")[-800:]
                raise RuntimeError(f"apps {sorted(want)} did not map on {self.display} within {timeout_s:g} s "
                                   f"({_windows_now(d, root, client_list)})"
                                   + (f": {tail}" if tail.strip() else " (apps.log is empty)"))
        finally:
            d.close()

    # -- the gym's connections --------------------------------------------------------------------------
    def x_server_running(self) -> bool:
        """Whether this desktop's X server (the first process it started) is still running."""
        return bool(self.procs) and self.procs[0].poll() is None

    def reconnect(self) -> None:
        """Open the gym's X connections to this display again (input, screen, damage), closing the old ones: one
        was lost (the X server closed it). Blocking; raises when the X server cannot be reached."""
        old = (self.xinput, self.screen)
        self.xinput = self.screen = None
        for obj in old:
            if obj is not None:
                with contextlib.suppress(Exception):   # already broken: that is why we are here
                    obj.close()
        xinput = XInput(self.display)
        try:
            self.screen = Screen(self.display)
        except BaseException:
            xinput.close()
            raise
        self.xinput = xinput
        logger.warning("desktop %s: the gym's X connections were lost and are open again", self.display)

    # -- stop ---------------------------------------------------------------------------------------
    def _step(self, what: str, fn, *args) -> None:
        """One step of ``stop``: a failure is logged and kept in ``stop_errors``, and the next steps run all the same."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - every later step must run; nothing is lost (logged, kept)
            self.stop_errors.append(f"{what}: {type(exc).__name__}: {exc}")
            logger.error("stopping desktop %s: could not %s: %s", self.display, what, exc, exc_info=True)

    def stop(self) -> None:
        """End everything the desktop started, step by step: the gym's X connections, every process (the
        sandbox, openbox, Xvfb), HOME's mount, the folder, the display's cookie. Each step runs whatever an
        earlier one raised (a desktop that broke a connection of the gym's made the first step raise, and the
        sandbox outlived its execution, issue 80); what failed is logged and listed in ``stop_errors``."""
        xinput, screen, self.xinput, self.screen = self.xinput, self.screen, None, None
        if xinput is not None:
            self._step("close the gym's input connection", xinput.close)
        if screen is not None:
            self._step("close the gym's screen connections", screen.close)
        for proc in reversed(self.procs):
            self._step(f"kill process {proc.pid} ({proc.args[0] if proc.args else '?'})", procs.kill_group, proc)
        self.procs.clear()
        if self.home_mounted:   # after the apps are gone; detaching frees the tmpfs's memory with its files
            self._step("unmount HOME", mounts.unmount, self.home)
            self.home_mounted = False
        if self.root.exists():
            self._step("remove the desktop's folder", shutil.rmtree, self.root)
        if self.display_num >= 0:
            self._step("forget the display's cookie", xauth.gym_authority().remove, self.display_num)
