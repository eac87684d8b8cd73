"""Ctrl-C during a CPU embedded run: the launcher stops the trainer, its workers and vLLM, the agent service
and the gym's desktops, prints its summary ("stopped by SIGINT", exit code 130) and exits; nothing it started
keeps running."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(900)]


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            os.kill(p, 0)
            alive.add(p)
        except ProcessLookupError:
            pass
    return alive


def test_ctrl_c_tears_everything_down(tmp_path):
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    log = open(tmp_path / "out.log", "w+")
    # Many steps, so that the run is surely still going when it is interrupted; no warm start (a teardown
    # test needs no trained model, and a cold cache would spend its deadline building one).
    proc = subprocess.Popen(["bash", str(ROOT / "examples/cua_agent/train.sh"), "total_train_steps=50",
                             "trial_name=interrupt", "sft.warm_start=false"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        # Interrupt mid-rollout: the desktops, the agent's runs and every server are up by then. The embedded
        # services log to the run's launcher.log (the console only shows the launcher's own lines).
        def services_log() -> str:
            return "".join(f.read_text() for f in (tmp_path / "fileroot").glob("logs/*/*/interrupt/launcher.log"))

        while not re.search(r"local_agent\.server: run \w+ started", services_log()):
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no agent run started"
            time.sleep(0.5)
        time.sleep(2)
        started = _descendants(proc.pid)
        assert started, "the launcher has no child processes"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = (tmp_path / "out.log").read_text()
    assert rc != 0 and "[cua-rl] training" in out and "[cua-rl] logs:" in out, out[-3000:]
    # a stop the user asked for reads as one: exit code 130, no "FAILED", no trainer traceback
    assert rc == 130 and "[cua-rl] training stopped by SIGINT" in out and "FAILED" not in out, out[-3000:]
    time.sleep(2)
    assert not _alive(started), f"left running: {_alive(started)}"
