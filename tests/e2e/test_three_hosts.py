"""The path users take: their gym, their agent service and our trainer on three different hosts.

``tests/hosts.py`` makes the hosts (network namespaces on one bridge; nothing reaches the machine's own
network, and no host shares another's loopback). The gym (``cua-gym serve``) runs on one, the agent service
(``cua-agent serve``, standing in for gbox-mini-agent) on another, and ``train.sh --gym http://GYM:5010
--gym-id desktop --gbox-mini-url http://AGENT:3000`` on the third, with vLLM on the CPU. The policy endpoint
must bind an address the agent can reach and put the trainer host's own address into each episode's
``model.baseUrl``: an endpoint on 127.0.0.1 made every turn fail on the agent's own loopback, and the run
once reported such episodes "evaluated" with 0 turns. Shown: 2 steps trained, 0 episodes lost, at least one
policy turn in every episode, every recorded turn's prompt ids verified against vLLM; while the run is on, a
fourth host calling the endpoint without a live episode's key gets 401.
"""

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from cua_rl.run.summary import read_scalars
from tests.hosts import Hosts

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "examples" / "cua_agent" / "config.learn.yaml"
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(900)]
# each worker's first episode says where the endpoint listens and what the agent is told (cua_rl/workflow/group.py)
LISTENING = re.compile(r"policy endpoint on (\S+); the agent service at \S+ is told to call http://[^:]+:(\d+)/v1")


def test_gym_agent_and_trainer_on_three_hosts_train_with_no_episode_lost(tmp_path):
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    for name in ("GYM_BASE_URL", "GYM_ID", "GBOX_MINI_AGENT_BASE_URL"):
        env.pop(name, None)
    with Hosts(["trainer", "gym", "agent", "other"]) as hosts:
        gym_url, agent_url = f"http://{hosts.ip('gym')}:5010", f"http://{hosts.ip('agent')}:3000"
        hosts.start("gym", [sys.executable, "-m", "cua_rl.local_gym", "serve", "--host", hosts.ip("gym"),
                            "--port", "5010", "--gym-id", "desktop", "--display-base", "700"],
                    tmp_path / "gym.log", env=env, cwd=ROOT)
        hosts.start("agent", [sys.executable, "-m", "cua_rl.local_agent", "serve", "--host", hosts.ip("agent"),
                              "--port", "3000"], tmp_path / "agent.log", env=env, cwd=ROOT)
        hosts.wait_http("trainer", f"{gym_url}/health")
        hosts.wait_http("trainer", f"{agent_url}/health")
        started = time.monotonic()
        train = hosts.start("trainer", [
            "bash", str(ROOT / "examples/cua_agent/train.sh"), "--config", str(LEARN), "--gym", gym_url,
            "--gym-id", "desktop", "--gbox-mini-url", agent_url, "total_train_steps=2", "train_dataset.batch_size=2",
            "gconfig.n_samples=2", "sft.warm_start=false", "trial_name=hosts"], tmp_path / "train_sh.log", env=env,
            cwd=ROOT)
        stranger = _stranger_while_running(hosts, train, tmp_path / "fileroot")
        rc = train.wait(800)
        out = (tmp_path / "train_sh.log").read_text(errors="replace")
        print(f"three hosts: exit code {rc} after {time.monotonic() - started:.0f} s; a fourth host got {stranger}")
    assert rc == 0, out[-5000:]
    assert stranger["endpoint"][0] == "0.0.0.0", stranger   # bound where the agent's host can reach it
    assert stranger["status"] == 401, stranger
    assert stranger["told"] == f"http://{hosts.ip('trainer')}:{stranger['endpoint'][1]}/v1", stranger
    episodes = re.search(r"episodes: +(\d+) evaluated, (\d+) lost", out)
    assert episodes and int(episodes.group(1)) >= 8 and episodes.group(2) == "0", out[-3000:]
    turns = re.search(r"policy endpoint: (\d+) turns with prompt ids verified .* (\d+) turns recorded", out)
    assert turns and int(turns.group(1)) == int(turns.group(2)) >= int(episodes.group(1)), out[-3000:]
    scalars = read_scalars(next((tmp_path / "fileroot" / "logs").glob("*/*/hosts/tensorboard")))
    # the share of episodes without a policy turn, over every step's episodes (a step's statistics may hold
    # the episodes read ahead for the next): 0 = every episode had one
    no_turn = scalars["rollout/no_policy_turn"]
    assert no_turn and all(v == 0 for _, v in no_turn), no_turn


def _stranger_while_running(hosts: Hosts, train, fileroot: Path) -> dict:
    """Once the endpoint listens: a chat request from the fourth host, which holds no episode's key."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and train.poll() is None:
        logs = list((fileroot / "logs").glob("*/*/hosts/rollout.log"))
        found = logs and LISTENING.search(logs[0].read_text(errors="replace"))
        if found:
            host, port = found.groups()
            told = found.group(0).rsplit(" ", 1)[1]
            body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
            status = hosts.http_status("other", f"http://{hosts.ip('trainer')}:{port}/v1/chat/completions", body)
            return {"endpoint": (host, port), "told": told, "status": status}
        time.sleep(1)
    return {"endpoint": (None, None), "told": None, "status": "the endpoint never said where it listens"}
