"""Joining a Ray cluster for ``scheduler.type=ray`` (cua_rl/areal_ext/ray_cluster.py), without a cluster.

The run itself under Ray (two nodes, gyms and agent on other hosts) is tests/e2e/test_gym_fleet.py. Here:
what of the trainer's environment its Ray workers get (the monitor token and vLLM's CPU settings yes, the
trainer's PATH and HOME no: they belong to the worker's own node), and that a wrong cluster address fails at
once with the address and what to do, where ``ray.init`` alone retried for 13 minutes; a loopback gym or
agent on a cluster of several nodes is refused before any worker starts.
"""

import subprocess
import sys
import time

import pytest

from cua_rl.areal_ext.ray_cluster import worker_env
from cua_rl.local_model.vllm_server import CPU_ENV


def test_the_workers_get_the_runs_settings_and_not_the_trainers_node_paths():
    trainer = {**CPU_ENV, "PATH": "/usr/bin", "HOME": "/root", "PROJECT_TOKEN": "t0k", "MONITOR_BASE_URL": "http://m",
               "PROJECT_ID": "p", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
               "CUDA_VISIBLE_DEVICES": "0", "RAY_ADDRESS": "10.0.0.1:6379"}
    got = worker_env(trainer)
    assert set(got) == set(CPU_ENV) | {"PROJECT_TOKEN", "MONITOR_BASE_URL", "PROJECT_ID", "HF_HUB_OFFLINE",
                                       "TRANSFORMERS_OFFLINE", "WANDB_MODE"}
    assert all(got[k] == trainer[k] for k in got)


def test_a_cluster_address_where_nobody_listens_fails_at_once_naming_it():
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", "from cua_rl.areal_ext.ray_cluster import connect; connect()"],
                         env={"RAY_ADDRESS": "127.0.0.1:9", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "nothing answers at the Ray cluster's address" in out.stderr and ":9 (RAY_ADDRESS)" in out.stderr, \
        out.stderr[-2000:]
    assert "ray start --head" in out.stderr
    assert time.monotonic() - started < 60


def test_loopback_services_are_refused_on_a_cluster_of_several_nodes(caplog):
    from cua_rl.areal_ext.ray_cluster import check_addresses
    from cua_rl.config import CUAConfig

    embedded = CUAConfig(gym_base_url="http://127.0.0.1:5010", gym_id="g",
                         gbox_mini_agent_base_url="http://10.0.0.3:3000").external_services()
    check_addresses(embedded, "", 1)   # one node: loopback is where the workers run
    try:
        check_addresses(embedded, "", 2)
    except SystemExit as exc:
        assert "gym_base_url=http://127.0.0.1:5010 is this node's loopback" in str(exc)
        assert "gbox_mini_agent_base_url" not in str(exc)
    else:
        raise AssertionError("a loopback gym on two nodes was accepted")
    fleet = CUAConfig(gym_base_url="http://10.0.0.2:5010,http://127.0.0.1:5011", gym_id="g",
                      gbox_mini_agent_base_url="http://10.0.0.3:3000").external_services()
    try:   # every host of a fleet of gyms is checked
        check_addresses(fleet, "", 2)
    except SystemExit as exc:
        assert "gym_base_url=http://127.0.0.1:5011 is this node's loopback" in str(exc) and "10.0.0.2" not in str(exc)
    else:
        raise AssertionError("a loopback gym host in a fleet on two nodes was accepted")
    routable = CUAConfig(gym_base_url="http://10.0.0.2:5010", gym_id="g",
                         gbox_mini_agent_base_url="http://10.0.0.3:3000").external_services()
    check_addresses(routable, "http://localhost:8700", 2)   # the fleet test's set-up; the monitor only warned about
    assert "Training Monitor at http://localhost:8700 is this node's loopback" in caplog.text


def test_the_gym_and_agent_tokens_reach_the_workers_as_values_and_a_ray_gym_needs_one(tmp_path, monkeypatch):
    """Issue 80: Ray gyms serve on their nodes' addresses, so the run has a gym token before the trainer joins the
    cluster (``ensure_gym_token``: the user's, else a fresh one), the workers get it (a token given as a file, as
    its value: the path means nothing on another node), and a Ray gym without one is never started."""
    from types import SimpleNamespace

    from cua_rl.areal_ext.ray_gyms import GymNode, ensure_gym_token

    (tmp_path / "agent-token").write_text("agent-secret\n")
    trainer = {"PATH": "/usr/bin", "CUA_AGENT_TOKEN_FILE": str(tmp_path / "agent-token")}
    ensure_gym_token(trainer)
    made = trainer["CUA_GYM_TOKEN"]
    assert len(made) >= 40
    ensure_gym_token(trainer)
    assert trainer["CUA_GYM_TOKEN"] == made   # one token for the run's whole fleet
    got = worker_env(trainer)
    assert got["CUA_GYM_TOKEN"] == made and got["CUA_AGENT_TOKEN"] == "agent-secret", got
    monkeypatch.delenv("CUA_GYM_TOKEN", raising=False)
    monkeypatch.delenv("CUA_GYM_TOKEN_FILE", raising=False)
    embedded = SimpleNamespace(num_desktops=1, tasks_dir="", reuse_browsers=None, restart_in_page=None)
    with pytest.raises(RuntimeError, match="no CUA_GYM_TOKEN in the Ray gym's environment"):
        GymNode([1, "desktop", embedded], str(tmp_path / "logs"))
    assert not list((tmp_path / "logs").glob("*.log"))   # no gym was started
