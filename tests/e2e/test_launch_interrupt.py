"""Ctrl-C during a CPU embedded run: the launcher stops the trainer, its workers and vLLM, the agent service
and the gym's desktops, prints its summary ("stopped by SIGINT", exit code 130) and exits; nothing it started
keeps running.

The same run checks the baseline evaluation before step 1 (``baseline_eval=true``, on two of the gym's
tasks so that there is an eval split): the console's baseline line and the embedded Training Monitor's
baseline of step 0. (The README command's run, tests/e2e/test_learning_gate.py, has no eval split.)"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.hosts import descendants, stop, wait_gone

ROOT = Path(__file__).resolve().parents[2]
# the one-turn recipe: the quickest run of the embedded stack (this test needs no learning, and the
# multi-turn default runs episodes of up to 6 turns)
LEARN = ROOT / "examples" / "cua_agent" / "config.learn.yaml"
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(900)]


def test_ctrl_c_tears_everything_down(tmp_path):
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    log = open(tmp_path / "out.log", "w+")
    # Many steps, so that the run is surely still going when it is interrupted; no warm start (a teardown
    # test needs no trained model, and a cold cache would spend its deadline building one).
    proc = subprocess.Popen(["bash", str(ROOT / "examples/cua_agent/train.sh"), "--config", str(LEARN), "total_train_steps=50",
                             "trial_name=interrupt", "sft.warm_start=false", "baseline_eval=true",
                             "task_source.kind=gym", "gym_limit=2", "train_dataset.batch_size=2",
                             "gconfig.n_samples=2"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        # Interrupt mid-rollout: the desktops, the agent's runs and every server are up by then. The embedded
        # services log to the run's launcher.log (the console only shows the launcher's own lines).
        def services_log() -> str:
            return "".join(f.read_text() for f in (tmp_path / "fileroot").glob("logs/*/*/interrupt/launcher.log"))

        def wait_for(what: str, done) -> None:
            while not done():
                assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"no {what}"
                time.sleep(0.5)

        def runs_started() -> int:
            return len(re.findall(r"local_agent\.server: run \w+ started", services_log()))

        wait_for("baseline", lambda: "baseline (policy version 0)" in (tmp_path / "out.log").read_text())
        baseline_runs = runs_started()
        wait_for("training agent run", lambda: runs_started() > baseline_runs)
        time.sleep(2)
        started = descendants([proc.pid]) - {proc.pid}
        assert started, "the launcher has no child processes"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(120)
    finally:
        stop(proc, signal.SIGKILL)
    out = (tmp_path / "out.log").read_text()
    assert rc != 0 and "[cua-rl] training" in out and "[cua-rl] logs:" in out, out[-3000:]
    # a stop the user asked for reads as one: exit code 130, no "FAILED", no trainer traceback
    assert rc == 130 and "[cua-rl] training stopped by SIGINT" in out and "FAILED" not in out, out[-3000:]
    assert re.search(r"baseline \(policy version 0\): num_turns [0-9.]+, reward [0-9.]+", out), out[-4000:]
    left = wait_gone(started, 15)
    assert not left, f"left running: {left}"
    _assert_monitor_has_the_baseline(next((tmp_path / "fileroot").glob("logs/*/*/interrupt/monitor/monitor.db")))


def _assert_monitor_has_the_baseline(db: Path) -> None:
    from cua_rl.monitor import views
    from cua_rl.monitor.store import Store, sqlite_url

    store = Store.open(sqlite_url(db))
    try:
        [run] = views.trainings(store)
        [baseline] = views.training(store, run["id"])["baselines"]
        assert baseline["step"] == 0 and baseline["summary"]["completed"] >= 2, baseline
        # each rollout names the embedded gym's execution and its live view (the rollout page's link)
        members = [m for g in views.groups(store, "baselines", baseline["id"])["groups"] for m in g["members"]]
        for member in members:
            rollout = views.rollout(store, member["id"])
            assert rollout["live_view"].endswith(f"/executions/{rollout['execution_id']}/live"), rollout
    finally:
        store.close()
