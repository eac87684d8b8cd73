"""The path users take: their gym, their agent service and our trainer on different hosts, on a Ray cluster.

``tests/hosts.py`` makes the hosts (network namespaces on one bridge; nothing reaches the machine's own
network, and no host shares another's loopback). The gym (``cua-gym serve``) runs on one, the agent service
(``cua-agent serve``, standing in for gbox-mini-agent) on another, and ``train.sh --gym http://GYM:5010
--gym-id desktop --gbox-mini-url http://AGENT:3000 scheduler.type=ray`` on the third, with vLLM on the CPU.
The training runs under AReaL's Ray scheduler on a two-node Ray cluster started the usual way: ``ray start
--head`` on the trainer's host, ``ray start --address`` on the gym's, one CPU each, so the actor and the
rollout worker (vLLM, the policy endpoint) land on different nodes. The policy endpoint must bind an address
the agent can reach and put its own node's address into each episode's ``model.baseUrl``: an endpoint on
127.0.0.1 made every turn fail on the agent's own loopback, and the run once reported such episodes
"evaluated" with 0 turns. Shown: 2 steps trained, 0 episodes lost, at least one policy turn in every
episode, every recorded turn's prompt ids verified against vLLM, the trainer's logprob gap in the statistics
(our worker patches reached Ray's workers); while the run is on, a fourth host calling the endpoint without a
live episode's key gets 401; afterwards no placement group or vLLM is left.
"""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from cua_rl.run.summary import read_scalars
from tests.hosts import Hosts, pids

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "examples" / "cua_agent" / "config.learn.yaml"
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(900)]
# each worker's first episode says where the endpoint listens and what the agent is told (cua_rl/workflow/group.py)
LISTENING = re.compile(r"policy endpoint on (\S+); the agent service at \S+ is told to call http://([^:]+):(\d+)/v1")
RAY = Path(sys.executable).with_name("ray")
RAY_PORT = 6380
RAY_DIR = f"/tmp/ray-hosts-{os.getpid()}"   # short: Ray's socket paths live under it


def test_gym_agent_and_trainer_on_three_hosts_train_with_no_episode_lost(tmp_path, request):
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    request.addfinalizer(lambda: [shutil.rmtree(d, ignore_errors=True) for d in (RAY_DIR, f"{RAY_DIR}-gym")])
    for name in ("GYM_BASE_URL", "GYM_ID", "GBOX_MINI_AGENT_BASE_URL"):
        env.pop(name, None)
    with Hosts(["trainer", "gym", "agent", "other"]) as hosts:
        gym_url, agent_url = f"http://{hosts.ip('gym')}:5010", f"http://{hosts.ip('agent')}:3000"
        env["RAY_ADDRESS"] = f"{hosts.ip('trainer')}:{RAY_PORT}"
        _ray_node(hosts, "trainer", ["--head", f"--port={RAY_PORT}", "--include-dashboard=false",
                                      "--disable-usage-stats", f"--temp-dir={RAY_DIR}"])
        # a directory of its own, as on another machine (the nodes would each collect the other's worker logs)
        _ray_node(hosts, "gym", [f"--address={env['RAY_ADDRESS']}", f"--temp-dir={RAY_DIR}-gym"])
        hosts.start("gym", [sys.executable, "-m", "cua_rl.local_gym", "serve", "--host", hosts.ip("gym"),
                            "--port", "5010", "--gym-id", "desktop", "--display-base", "700"],
                    tmp_path / "gym.log", env=env, cwd=ROOT)
        hosts.start("agent", [sys.executable, "-m", "cua_rl.local_agent", "serve", "--host", hosts.ip("agent"),
                              "--port", "3000"], tmp_path / "agent.log", env=env, cwd=ROOT)
        hosts.wait_http("trainer", f"{gym_url}/health")
        hosts.wait_http("trainer", f"{agent_url}/health")
        started, vllm_before = time.monotonic(), pids("areal_vllm_server")
        train = hosts.start("trainer", [
            "bash", str(ROOT / "examples/cua_agent/train.sh"), "--config", str(LEARN), "--gym", gym_url,
            "--gym-id", "desktop", "--gbox-mini-url", agent_url, "total_train_steps=2", "train_dataset.batch_size=2",
            "gconfig.n_samples=2", "sft.warm_start=false", "trial_name=hosts", "scheduler.type=ray"], tmp_path / "train_sh.log", env=env,
            cwd=ROOT)
        stranger = _stranger_while_running(hosts, train, tmp_path / "fileroot")
        rc = train.wait(800)
        out = (tmp_path / "train_sh.log").read_text(errors="replace")
        print(f"three hosts: exit code {rc} after {time.monotonic() - started:.0f} s; a fourth host got {stranger}")
        left = hosts.run("trainer", [str(RAY), "status", f"--address={env['RAY_ADDRESS']}"]).stdout
        vllm_left = pids("areal_vllm_server") - vllm_before   # while the Ray nodes still run
    assert rc == 0, out[-5000:]
    assert stranger["endpoint"][0] == "0.0.0.0", stranger   # bound where the agent's host can reach it
    assert stranger["status"] == 401, stranger
    node = next(n for n in ("trainer", "gym") if hosts.ip(n) == stranger["host"])   # the rollout worker's node
    assert stranger["told"] == f"http://{hosts.ip(node)}:{stranger['endpoint'][1]}/v1", stranger
    # every worker, placement group and vLLM server gone with the run
    assert "Pending Demands:\n (no resource demands)" in left and " 0.0/2.0 CPU" in left, left
    assert not vllm_left, vllm_left
    episodes = re.search(r"episodes: +(\d+) evaluated, (\d+) lost", out)
    assert episodes and int(episodes.group(1)) >= 8 and episodes.group(2) == "0", out[-3000:]
    turns = re.search(r"policy endpoint: (\d+) turns with prompt ids verified .* (\d+) turns recorded", out)
    assert turns and int(turns.group(1)) == int(turns.group(2)) >= int(episodes.group(1)), out[-3000:]
    scalars = read_scalars(next((tmp_path / "fileroot" / "logs").glob("*/*/hosts/tensorboard")))
    # the share of episodes without a policy turn, over every step's episodes (a step's statistics may hold
    # the episodes read ahead for the next): 0 = every episode had one
    no_turn = scalars["rollout/no_policy_turn"]
    assert no_turn and all(v == 0 for _, v in no_turn), no_turn
    gap = [key for key in scalars if key.endswith("sampler_logprob_gap")]   # cua_rl.areal_ext.worker.ray_setup ran
    assert gap and all(abs(v) < 1e-2 for _, v in scalars[gap[0]]), scalars.get(gap[0] if gap else "", gap)


def _ray_node(hosts: Hosts, name: str, role: list[str]) -> None:
    """A Ray node on host ``name`` (the Ray of the trainer's Python environment), one CPU: the actor's and the
    rollout's 8 GiB placement groups (config.learn.yaml) then fit one per node."""
    out = hosts.run(name, [str(RAY), "start", *role, f"--node-ip-address={hosts.ip(name)}", "--num-cpus=1",
                           "--num-gpus=0", f"--memory={9 * 2**30}", f"--object-store-memory={2**29}"],
                    timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def _stranger_while_running(hosts: Hosts, train, fileroot: Path) -> dict:
    """Once the endpoint listens: a chat request from the fourth host, which holds no episode's key."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and train.poll() is None:
        # under Ray the rollout worker's output is in train.log (Ray sends it to the trainer)
        logs = list((fileroot / "logs").glob("*/*/hosts/train.log"))
        found = logs and LISTENING.search(logs[0].read_text(errors="replace"))
        if found:
            bound, host, port = found.groups()
            told = found.group(0).rsplit(" ", 1)[1]
            body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
            status = hosts.http_status("other", f"http://{host}:{port}/v1/chat/completions", body)
            return {"endpoint": (bound, port), "host": host, "told": told, "status": status}
        time.sleep(1)
    return {"endpoint": (None, None), "host": None, "told": None, "status": "the endpoint never said where it listens"}
