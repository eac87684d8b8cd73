"""The launch mode train.sh uses on a CPU: AReaL's PPOTrainer in SPMD mode (one process) with the
rollout server given by AREAL_LLM_SERVER_ADDRS = a `cua-model serve` child process. One GRPO step with
AReaL's own VisionRLVRWorkflow, then a disk weight update that the server must report as version 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from cua_rl.local_model import ModelServerProcess
from cua_rl.asgi_thread import free_port

HERE = Path(__file__).parent / "spmd"


def test_ppo_trainer_spmd_against_cua_model_serve(tiny_dir, tmp_path):
    with ModelServerProcess(tiny_dir, threads=1, log_path=tmp_path / "serve.log") as srv:
        env = {**os.environ, "AREAL_SPMD_MODE": "1", "AREAL_LLM_SERVER_ADDRS": srv.addr, "RANK": "0",
               "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        cmd = [sys.executable, str(HERE / "train_tiny.py"), "--config", str(HERE / "tiny_grpo.yaml"),
               f"actor.path={tiny_dir}", f"cluster.fileroot={tmp_path / 'fileroot'}",
               f"cluster.name_resolve.nfs_record_root={tmp_path / 'name_resolve'}",
               f"trial_name=t{uuid.uuid4().hex[:8]}"]
        proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=500)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        done = [line for line in out.splitlines() if line.startswith("SPMD_DONE")]
        assert done, out[-4000:]
        assert json.loads(done[0].split(" ", 1)[1]) == {"actor_version": 1, "rollout_version": 1}
        info = httpx.get(srv.url + "/version").json()
        assert info["version"] == 1 and info["weights_path"].endswith("weight_update_v1")
