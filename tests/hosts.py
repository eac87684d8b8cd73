"""The tests' toolbox for processes and servers, and hosts for a test: Linux network namespaces on one bridge.

The toolbox (one of each, used by every test that starts a process; write no copy in a test module):
- ``wait_http``: poll a route until it answers (200, or what ``ready`` accepts), failing at once when the process
  serving it exits, with its log;
- ``stop``: a signal to a process (its process group when it leads one), SIGKILL after a timeout;
- ``alive``, ``wait_gone``: which processes still run, polled with a deadline; ``left_behind``: what a run left
  running (instead of a fixed sleep before the check);
- ``pids``, what runs here (or what runs of this clone's lane left); ``descendants``, a process tree from /proc;
  ``children``; ``Service``, one of our servers as its own process on this host's loopback.

A multi-host run (the gym, the agent service and the trainer on different machines) is what users run and
what a loopback-only test cannot see: an address that works on 127.0.0.1 and nowhere else. Each host here
is a network namespace with its own loopback, one interface on a private bridge (``10.77.N.0/24``) and a
default route to an address nobody holds, so every program finds "its" address the way it would on a
cluster node (AReaL's ``gethostip`` asks the kernel for the route out) while no packet leaves the test's
hosts. The bridge lives in a namespace of its own; nothing is changed in the machine's own network.
Needs root (``ip netns``). Processes are started with ``ip netns exec`` in their own process group and
ended, with the namespaces, when the ``with`` block exits, even on failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import httpx

ROOT = Path(__file__).resolve().parents[1]
_GATEWAY = 254   # the default route's next hop: an address on the bridge that nobody holds


def pids(pattern: str, *, here: bool = False) -> set[int]:
    """Processes on this host whose command line matches ``pattern`` (``pgrep -f``): what a test compares
    before and after a run to show nothing was left running. ``here``: only this test's lane's: those working in
    this clone (``ROOT``: a test's runs and services start there, and the desktops and vLLM servers they spawn
    inherit it) and not below another lane of this suite (``other_lanes``), so another clone's jobs on the
    machine (a calibration's runs, a second CI) and the tests running beside this one are neither counted nor
    blamed. A process a run left behind is counted wherever it was reparented."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    found = {int(p) for p in out.split()}
    if not here:
        return found
    beside = other_lanes()
    return {p for p in found if _cwd(p) == ROOT and p not in beside}


def other_lanes() -> set[int]:
    """Every process below the suite's other lanes, which run tests at the same time as this one (scripts/test.sh
    runs pytest-xdist workers, each a child of the controller): the controller's tree less this worker's own.
    Empty when the suite runs in one process."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return set()
    controller = os.getppid()
    return descendants([controller]) - descendants([os.getpid()]) - {controller}


def descendants(root_pids: list[int]) -> set[int]:
    """Every live process below (and including) ``root_pids``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), list(root_pids)
    while todo:
        pid = todo.pop()
        if pid in found or not os.path.exists(f"/proc/{pid}"):
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:   # gone meanwhile
        return None


def children(pid: int, pattern: str) -> set[int]:
    """The children of process ``pid`` whose command line matches ``pattern`` (``pgrep -P``): a server's own
    processes, not those another job on this host started meanwhile."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def tail(log: Path | None, chars: int = 3000) -> str:
    """The end of a log file, for an assertion message ("" when there is none)."""
    return log.read_text(errors="replace")[-chars:] if log is not None and log.is_file() else ""


def wait_http(url: str, proc: subprocess.Popen | None = None, log: Path | None = None, timeout_s: float = 60,
              ready: Callable[[httpx.Response], bool] = lambda answer: answer.status_code == 200,
              **get) -> httpx.Response:
    """``GET url`` until ``ready(answer)`` (default: a 200), polled every 0.2 s; its answer. Fails at once when
    ``proc`` (what serves it) has exited, and after ``timeout_s``, with ``log``'s tail. ``get``: httpx.get's
    keywords (headers, ...)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server of {url} exited with {proc.returncode} before it answered:\n"
                                 f"{tail(log)}")
        answer = None
        try:
            answer = httpx.get(url, timeout=2, **get)
            if ready(answer):
                return answer
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            said = f"HTTP {answer.status_code}" if answer is not None else "no answer"
            raise AssertionError(f"{url} was not ready within {timeout_s:g} s ({said}):\n{tail(log)}")
        time.sleep(0.2)


def _send(proc: subprocess.Popen, sig: int, group: bool) -> None:
    try:
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
    except ProcessLookupError:   # gone meanwhile
        pass


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30, group: bool | None = None) -> int:
    """``sig`` to ``proc``, then SIGKILL if it has not exited after ``timeout_s``; its exit code. ``group``: to its
    whole process group (default: when it leads one, i.e. was started with ``start_new_session``)."""
    if proc.poll() is None:
        if group is None:
            try:
                group = os.getpgid(proc.pid) == proc.pid
            except ProcessLookupError:
                group = False
        _send(proc, sig, group)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _send(proc, signal.SIGKILL, group)
    return proc.wait()


def alive(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` that still exist and are not zombies."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def wait_gone(pids: Iterable[int], timeout_s: float = 10.0) -> set[int]:
    """Those of ``pids`` still alive after ``timeout_s`` (returns as soon as none is)."""
    pids = set(pids)
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def left_behind(pattern: str, before: set[int], timeout_s: float = 15.0) -> set[int]:
    """This lane's processes matching ``pattern`` that were not in ``before`` and still run after ``timeout_s``
    (returns as soon as none does): what a stopped run left behind, given the moment its processes take to exit."""
    deadline = time.monotonic() + timeout_s
    while (left := pids(pattern, here=True) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """``with Hosts(["trainer", "gym"]) as hosts: hosts.ip("gym"); hosts.start("gym", argv, log)``."""

    def __init__(self, names: list[str], subnet: int = 77):
        self.tag = f"cua{os.getpid() % 100000}"
        self.names = list(names)
        self.subnet = subnet
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def ip(self, name: str) -> str:
        return f"10.{self.subnet}.0.{self.names.index(name) + 1}"

    def __enter__(self) -> "Hosts":
        try:
            bridge = self.ns("bridge")
            _ip("netns", "add", bridge)
            self._made.append(bridge)
            _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", bridge, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns, port = self.ns(name), f"{self.tag}p{i}"[-15:]
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", port, "netns", bridge)
                _ip("-n", bridge, "link", "set", port, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "route", "add", "default", "via", f"10.{self.subnet}.0.{_GATEWAY}")
        except subprocess.CalledProcessError as exc:
            self.__exit__(None, None, None)
            raise RuntimeError(f"could not make the test's hosts ({' '.join(exc.cmd)}): {exc.stderr.strip()}; "
                               "network namespaces need root") from exc
        return self

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> subprocess.Popen:
        """``argv`` on host ``name``, in its own process group, stdout and stderr into ``log``."""
        with open(log, "w") as sink:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns(name), *argv], stdout=sink,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        self._procs.append(proc)
        return proc

    def run(self, name: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns(name), *argv], capture_output=True, text=True,
                              timeout=timeout)

    def http_status(self, name: str, url: str, data: bytes | None = None, timeout: float = 5) -> int | str:
        """The HTTP status of ``url`` asked from host ``name`` (a POST when ``data``), or the connection error."""
        code = ("import sys, urllib.request, urllib.error\n"
                "req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode() or None, "
                "headers={'Content-Type': 'application/json'})\n"
                "try:\n    print(urllib.request.urlopen(req, timeout=float(sys.argv[3])).status)\n"
                "except urllib.error.HTTPError as e:\n    print(e.code)\n"
                "except OSError as e:\n    print(type(e).__name__, e)\n")
        out = self.run(name, ["python3", "-c", code, url, (data or b"").decode(), str(timeout)], timeout=timeout + 10)
        text = out.stdout.strip() or out.stderr.strip()
        return int(text) if text.isdigit() else text

    def wait_http(self, name: str, url: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while (status := self.http_status(name, url)) != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer 200 from host {name} within {timeout:.0f} s: {status}")
            time.sleep(1)

    def stop(self, proc: subprocess.Popen, timeout: float = 60) -> int | None:
        """SIGTERM to ``proc``'s process group, SIGKILL after ``timeout``; its exit code."""
        return stop(proc, timeout_s=timeout, group=True)

    def __exit__(self, *exc) -> None:
        for proc in reversed(self._procs):
            self.stop(proc)
        for ns in reversed(self._made):
            left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in left:   # anything a stopped process left behind on that host
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()


class Service:
    """One of our servers as its own process, killed and restarted on the same port."""

    def __init__(self, argv: list[str], port: int, logs: Path, name: str) -> None:
        self.argv, self.port, self.logs, self.name = argv, port, logs, name
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.proc = subprocess.Popen([sys.executable, "-m", *self.argv, "--port", str(self.port)], cwd=ROOT,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/health", self.proc, self.log)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM to the server alone (its orderly shutdown ends what it started), SIGKILL after 30 s."""
        if self.proc is not None:
            stop(self.proc, group=False)
