"""AReaL's own remote vLLM engine (RemotevLLMEngine) generating from ``cua-model serve`` (a real child
process started the way training starts it), for text and image prompts, through an interruption."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from areal.api import ModelRequest
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.engine.vllm_remote import RemotevLLMEngine
from lm_helpers import png_b64, screenshot
from PIL import Image
from transformers import AutoProcessor, GenerationConfig

from cua_rl.local_model import ModelServerProcess


@pytest.fixture(scope="module")
def server_proc(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    with ModelServerProcess(tiny_dir, threads=1, log_path=log) as proc:
        yield proc


@pytest.fixture(scope="module")
def engine(server_proc):
    cfg = InferenceEngineConfig(backend="vllm:d1", experiment_name="lm-engine", trial_name=uuid.uuid4().hex,
                                setup_timeout=60, request_timeout=120, max_concurrent_rollouts=4)
    eng = RemotevLLMEngine(cfg)
    eng.initialize(addr=[server_proc.addr])
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def processor(tiny_dir):
    return AutoProcessor.from_pretrained(tiny_dir)


async def test_text_prompt_via_token_ids(engine, processor, tiny_dir):
    tok = processor.tokenizer
    text = processor.apply_chat_template([{"role": "user", "content": "Open the editor."}],
                                         add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text)
    g = GenerationHyperparameters(max_new_tokens=12, temperature=1.0, stop_token_ids=[tok.eos_token_id])
    resp = await engine.agenerate(ModelRequest(input_ids=ids, gconfig=g, tokenizer=tok))
    assert resp.input_tokens == ids
    assert 1 <= resp.output_len <= 12 and len(resp.output_logprobs) == resp.output_len
    assert resp.stop_reason in ("stop", "length")
    if resp.stop_reason == "stop":  # like vLLM: the requested stop ids or the model's generation-config eos ids
        eos = GenerationConfig.from_pretrained(tiny_dir).eos_token_id
        assert resp.output_tokens[-1] in {tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    assert resp.output_versions == [0] * resp.output_len


async def test_image_prompt_via_vision_messages(engine, processor):
    """The image path AReaL's vLLM backend takes: ``vision_msg_vllm`` -> /v1/chat/completions."""
    b64 = png_b64(screenshot(seed=3))
    tok_msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click OK."}]}]
    vllm_msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}},
                                              {"type": "text", "text": "Click OK."}]}]
    text = processor.apply_chat_template(tok_msgs, add_generation_prompt=True, tokenize=False)
    import base64
    import io
    pil = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    ids = processor(images=[pil], text=[text], return_tensors="pt")["input_ids"][0].tolist()
    g = GenerationHyperparameters(max_new_tokens=10, temperature=1.0)
    resp = await engine.agenerate(ModelRequest(input_ids=ids, image_data=[b64], vision_msg_vllm=[vllm_msgs],
                                               gconfig=g, tokenizer=processor.tokenizer, processor=processor))
    assert resp.input_tokens == ids
    assert 1 <= resp.output_len <= 10 and len(resp.output_logprobs) == resp.output_len
    assert all(lp <= 0 for lp in resp.output_logprobs)


async def test_generation_survives_pause_and_continue(engine, processor, server_proc):
    """AReaL pauses servers around weight updates; agenerate must resume and still return a whole answer.
    Token-id path: the partial output comes back with 'abort' and AReaL continues from it."""
    ids = processor.tokenizer.encode("Type the text into the search box")
    n = 4000
    g = GenerationHyperparameters(max_new_tokens=n, temperature=1.0, ignore_eos=True)
    before = httpx.get(server_proc.url + "/version").json()["aborted_requests"]
    task = asyncio.create_task(engine.agenerate(ModelRequest(input_ids=ids, gconfig=g)))
    await _until(lambda: httpx.get(server_proc.url + "/version").json()["running_requests"] == 1)
    await asyncio.sleep(0.2)
    await asyncio.to_thread(engine.pause_generation)
    await asyncio.sleep(0.5)
    info = httpx.get(server_proc.url + "/version").json()
    assert info["aborted_requests"] == before + 1 and info["paused"]
    assert not task.done()                     # the aborted request is retried, held by the paused server
    await asyncio.to_thread(engine.continue_generation)
    resp = await asyncio.wait_for(task, 300)
    assert resp.output_len == n and resp.stop_reason == "length"
    assert len(resp.output_logprobs) == n


async def _until(cond, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await asyncio.to_thread(cond):
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)
