"""ModelServerProcess: a server whose parent dies without stopping it shuts itself down (no orphans)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time


def _alive(pid: int) -> bool:
    return subprocess.run(["ps", "-p", str(pid), "-o", "stat="], capture_output=True, text=True).stdout.strip() \
        not in ("", "Z")


def test_server_exits_when_its_parent_dies(tiny_dir):
    code = textwrap.dedent(f"""
        import os
        from cua_rl.local_model import ModelServerProcess
        p = ModelServerProcess({str(tiny_dir)!r}, threads=1)
        print(p.proc.pid, flush=True)
        os._exit(0)   # die without p.stop()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    pid = int(out.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.25)
    if _alive(pid):   # clean up before failing
        subprocess.run(["kill", "-9", str(pid)])
        raise AssertionError("the orphaned model server kept running")
