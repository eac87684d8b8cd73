"""Services dying mid-run, on the CPU stack with real processes: the gym and the agent service run as their own
processes (``python -m cua_rl.local_gym serve``, ``python -m cua_rl.local_agent serve``) so they can be killed;
``train.sh --gym ... --gbox-mini-url ...`` trains against them with real vLLM and AReaL's trainer.

1. the agent service is SIGKILLed while a run is in flight and restarted 3 s later on the same port;
2. after the next step, the gym is SIGKILLed while a run is in flight (its desktops must die with it) and
   restarted once they are gone;
3. after the next step, the model server (vLLM) is SIGKILLed.

Must hold: the episodes in flight are lost (counted, never given a reward: a zero would bias GRPO), the run
recovers when the agent service or the gym returns (steps continue; new episodes wait for a restarting
service instead of failing), a dead model server stops the run with a clear cause in the summary, and
nothing is left running. The lost episodes per fault are printed (the workflow's own counts, the files the
summary adds up).
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cua_rl.http.serve import free_port
from tests.hosts import Service, children, left_behind, pids, stop, wait_gone

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(1500)]
STEPS = 12   # more than the faults need: the run must still be going when vLLM is killed


def _wait(cond, what: str, trainer: subprocess.Popen, out: Path, timeout_s: float = 600.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        assert trainer.poll() is None, f"the run ended while waiting for {what}:\n{out.read_text()[-5000:]}"
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{out.read_text()[-5000:]}")


def _steps_done(out: Path) -> int:
    return max((int(n) for n in re.findall(r"\[cua-rl\] step (\d+)/", out.read_text(errors="replace"))), default=0)


def _episode_counts(fileroot: Path) -> dict[str, int]:
    """The workflow's counts, summed as the run's summary sums them (empty before the first group ends)."""
    from cua_rl.run.summary import endpoint_totals

    logs = next(fileroot.glob("logs/*/*/faults/policy_endpoint"), None)
    return endpoint_totals(logs.parent) if logs is not None else {}


def test_killed_services_lose_only_their_episodes_and_the_run_recovers_or_stops_clearly(tmp_path):
    fileroot = tmp_path / "fileroot"
    xvfb_before, vllm_before = pids("^Xvfb", here=True), pids("areal_vllm_server", here=True)
    gym = Service(["cua_rl.local_gym", "serve", "--gym-id", "desktop", "--pool-size", "2"], free_port(), tmp_path,
                  "gym")
    agent = Service(["cua_rl.local_agent", "serve"], free_port(), tmp_path, "agent")
    out = tmp_path / "train.out"
    trainer = None
    try:
        gym.start()
        agent.start()
        env = {**os.environ, "CUA_RL_FILEROOT": str(fileroot), "CUA_RL_DEVICE": "cpu"}
        trainer = subprocess.Popen(
            ["bash", str(ROOT / "examples/cua_agent/train.sh"), "--gym", gym.url, "--gym-id", "desktop",
             "--gbox-mini-url", agent.url, f"total_train_steps={STEPS}", "trial_name=faults"],
            cwd=ROOT, env=env, stdout=open(out, "w"), stderr=subprocess.STDOUT)
        lost = {}

        def runs_started() -> int:
            """Agent runs the current agent service process has started (its log)."""
            return len(re.findall(r"run \w+ started", agent.log.read_text(errors="replace")))

        # 1. the agent service, mid-run
        _wait(lambda: runs_started() > 0, "the first agent run", trainer, out, 900)
        before = _episode_counts(fileroot).get("episodes_lost", 0)
        agent.kill()
        time.sleep(3)
        agent.start()
        step = _steps_done(out)
        _wait(lambda: _steps_done(out) > step + 1, "two steps after the agent service came back", trainer, out)
        lost["agent service"] = _episode_counts(fileroot).get("episodes_lost", 0) - before

        # 2. the gym, mid-run: its desktops die with it
        runs_seen = runs_started()
        _wait(lambda: runs_started() > runs_seen, "an agent run on the gym", trainer, out)
        before = _episode_counts(fileroot).get("episodes_lost", 0)
        gym_desktops = children(gym.proc.pid, "^Xvfb")   # its own: another job's desktops may come and go
        assert gym_desktops, "no desktop of the gym's found while an agent run was on it"
        gym.kill()
        assert not wait_gone(gym_desktops, 15), "the killed gym left its desktops running"
        gym.start()
        step = _steps_done(out)
        _wait(lambda: _steps_done(out) > step + 1, "two steps after the gym came back", trainer, out)
        lost["gym"] = _episode_counts(fileroot).get("episodes_lost", 0) - before

        # 3. the model server: the run cannot go on and must say why
        before = _episode_counts(fileroot).get("episodes_lost", 0)
        vllm = pids("areal_vllm_server", here=True) - vllm_before
        assert vllm, "no vLLM process found"
        for pid in vllm:
            os.kill(pid, signal.SIGKILL)
        rc = trainer.wait(300)
        text = out.read_text(errors="replace")
        lost["model server"] = _episode_counts(fileroot).get("episodes_lost", 0) - before
        counts = _episode_counts(fileroot)
        print(f"fault e2e: lost episodes per fault {json.dumps(lost)}; all episodes {json.dumps(counts)}; "
              f"steps done {_steps_done(out)}")
        assert rc != 0 and "training FAILED" in text, text[-4000:]
        assert re.search(r"cause: +the model server at \S+ stopped answering", text), text[-4000:]
        assert re.search(r"episodes: +\d+ evaluated, \d+ lost to infrastructure failures", text), text[-4000:]
        # each killed service lost what it had in flight, and nothing else was turned into a score
        assert lost["agent service"] >= 1 and lost["gym"] >= 1, lost
        assert counts["episodes_evaluated"] > 0, counts
    finally:
        if trainer is not None:
            stop(trainer, signal.SIGINT, timeout_s=120)
        agent.stop()
        gym.stop()
    assert not left_behind("^Xvfb", xvfb_before), "desktops left behind"
    assert not left_behind("areal_vllm_server", vllm_before), "vLLM left behind"
