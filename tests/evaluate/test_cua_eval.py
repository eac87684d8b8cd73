"""Issue 35 item 6: ``cua-eval`` on a user's gym. A checkpoint saved as training saves one (a Hugging Face
model directory) is loaded into a running AReaL vLLM server (``--model-url``: the session's, as a user's GPU
server would be) and plays two tasks of a gym reached only by its URL (our embedded gym standing in for the
user's), with our agent started by cua-eval (``--agent embedded``); the JSON reports success per task, and
every episode reached the model. The served model is put back afterwards (the session's server is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from cua_rl.local_gym.server import start_gym_server


@pytest.fixture
def saved_checkpoint(tiny_model_dir, tmp_path):
    """The tiny model saved again, through transformers' save_pretrained (what AReaL's HF checkpoints are)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "checkpoint"
    AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).save_pretrained(out)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_cua_eval_reports_success_per_task_on_a_gym_by_url(vllm_server, tiny_model_dir, saved_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    env = {k: v for k, v in os.environ.items() if k not in ("GYM_BASE_URL", "GYM_ID", "GBOX_MINI_AGENT_BASE_URL")}
    with start_gym_server(gym_id="desktop", pool_size=2, max_executions=2) as gym:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "cua_rl.evaluate", "--gym", gym.url, "--gym-id", "desktop",
                 "--checkpoint", str(saved_checkpoint), "--model-url", vllm_server.url, "--agent", "embedded",
                 "--split", "eval", "--episodes-per-task", "1", "--concurrency", "2", "--out", str(out),
                 "gym_limit=2", "max_turns=2", f"actor.path={tiny_model_dir}"],
                env=env, capture_output=True, text=True, timeout=600)
        finally:
            r = httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": tiny_model_dir}, timeout=300)
            assert r.status_code == 200, r.text
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result] = json.loads(out.read_text())
    assert result["checkpoint"] == str(saved_checkpoint)
    assert result["episodes"] == 2 and len(result["per_task"]) == 2, result
    assert result["dropped"] == 0 and result["model_errors"] == 0, result
    assert result["mean_turns"] >= 1, "an episode never reached the model"
    assert 0.0 <= result["success"] <= 1.0 and result["slices"] == {}
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [p["per_task"] for p in printed] == [result["per_task"]]


def test_cua_eval_refuses_an_empty_split_clearly(tmp_path):
    with start_gym_server(gym_id="desktop", pool_size=1, max_executions=1) as gym:
        proc = subprocess.run(
            [sys.executable, "-m", "cua_rl.evaluate", "--gym", gym.url, "--gym-id", "desktop", "--checkpoint",
             str(tmp_path), "--split", "eval", "gym_train_ratio=1.0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "the eval split of gym 'desktop' is empty" in proc.stderr, proc.stderr[-2000:]
