"""Shared test helpers live in helper modules (tests/hosts.py, the toolbox; a folder's ``*_helpers.py`` and the
like), never in a test module or a conftest.py that others import: such an import runs the other module's tests'
set-up at import, ties the two files' fates, and is how the same helper ended up written again beside it
(issue 87 item 3). Light: the files are read with ``ast``, nothing is imported. And the toolbox itself: ``stop``
ends a process group that ignores SIGTERM, ``wait_http`` fails at once, with the log, when its server exits."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cua_rl.http.serve import free_port
from tests.hosts import alive, descendants, stop, wait_gone, wait_http

REPO = Path(__file__).resolve().parents[2]


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an import names, ``from a import b`` as ``a.b`` too."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def test_no_test_module_or_bench_imports_a_test_module_or_a_conftest():
    files = [*sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "bench").rglob("*.py"))]
    found = []
    for path in files:
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            last = name.rsplit(".", 1)[-1]
            if last.startswith("test_") or last == "conftest":
                found.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not found, "move the helper into a helper module (tests/hosts.py for processes and servers):\n" + \
        "\n".join(found)


def test_stop_ends_a_whole_process_group_that_ignores_sigterm_and_wait_gone_sees_it():
    """The toolbox's ``stop``: SIGTERM, then SIGKILL to the group after the timeout; the child went with it."""
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    group = descendants([proc.pid])
    assert len(group) == 2 and alive(group) == group
    assert stop(proc, timeout_s=0.5) == -signal.SIGKILL
    assert wait_gone(group, 10) == set()


def test_wait_http_fails_at_once_with_the_log_when_the_server_exits(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no port for me')"], stderr=sink)
    started = time.monotonic()
    with pytest.raises(AssertionError, match="exited with 1 before it answered:\n.*no port for me"):
        wait_http(f"http://127.0.0.1:{free_port()}/health", proc, log, timeout_s=60)
    assert time.monotonic() - started < 10


def test_a_killed_test_browser_leaves_no_singleton_folder_in_tmp(tmp_path):
    """Chromium keeps its singleton socket in a folder of TMPDIR (``org.chromium.Chromium.*``, linked from the
    profile's ``SingletonSocket``) and removes it only on a clean exit: killed, it left the folder in /tmp (55 in a
    day of the shared machine). The test browser gets a TMPDIR of its own, removed with it (tests/chromium.py)."""
    import os
    import signal
    from pathlib import Path

    from tests.chromium import driver

    profile = tmp_path / "chromium"
    with driver(profile) as chrome:
        chrome.get("about:blank")
        folder = Path(os.readlink(profile / "SingletonSocket")).parent
        assert folder.is_dir()
        os.kill(chrome.service.process.pid, signal.SIGKILL)   # chromedriver; then its browser
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                if str(profile) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not folder.exists(), f"the killed browser left {folder}"
