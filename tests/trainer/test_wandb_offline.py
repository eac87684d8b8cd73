"""Issue 35 item 5: W&B through AReaL's own ``stats_logger.wandb``, in offline mode (no account, no network):
the recipe's config with ``stats_logger.wandb.mode=offline`` makes AReaL's StatsLogger write a W&B run under
the run's log directory, with the trainer's statistics (a step of AReaL's names and our health values) in it,
without a W&B account.
``wandb sync <dir>`` uploads it later from a machine that can reach W&B."""

from __future__ import annotations

import os
import subprocess
import sys

from cua_rl.run.launch import RECIPES, load_config


def test_areal_stats_logger_writes_an_offline_wandb_run(tmp_path, monkeypatch):
    import wandb
    from areal.api.io_struct import FinetuneSpec
    from areal.utils.stats_logger import StatsLogger

    from cua_rl.train import wandb_environment

    monkeypatch.delenv("WANDB_MODE", raising=False)          # the config decides, as in a user's run
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # what AReaL's StatsLogger does first for any mode but "disabled": without an account it fails (so an offline
    # run crashed at start-up before cua_rl.train.wandb_environment); in a child, as W&B's settings are global
    bare = subprocess.run([sys.executable, "-c", "import wandb; wandb.login()"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "WANDB_MODE"}, timeout=120)
    assert bare.returncode != 0 and "No API key" in bare.stderr
    config = load_config(str(RECIPES / "config.cpu.yaml"), [
        f"cluster.fileroot={tmp_path}", "trial_name=wandb-offline", "gym_base_url=http://127.0.0.1:9",
        "stats_logger.wandb.mode=offline", "+stats_logger.wandb.project=cua-test"])
    wandb_environment(config)                                  # what cua_rl.train does after loading the config
    logger = StatsLogger(config, FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=4))
    try:
        logger.commit(0, 0, 0, {"ppo_actor/update/actor_loss/avg": -0.25, "health/no_policy_turn": 0.0})
    finally:
        logger.close()
        # The run's file is written by W&B's service process (wandb-core), which holds the records in memory
        # and writes them when it closes the run, after wandb.finish() has returned: read right away, a loaded
        # machine found only the file's 7-byte header. wandb.teardown() returns once that process has closed
        # every run and exited (what a trainer's exit does), so the file is complete when it is read.
        wandb.teardown()
    runs = list((tmp_path / "logs").rglob("offline-run-*"))
    assert len(runs) == 1, f"no offline W&B run under {tmp_path / 'logs'}"
    [data] = list(runs[0].glob("run-*.wandb"))
    blob = data.read_bytes()
    assert b"actor_loss" in blob and b"health/no_policy_turn" in blob
    assert os.environ.get("WANDB_API_KEY") is None
