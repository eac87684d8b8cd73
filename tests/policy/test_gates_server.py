"""Correctness gates of the policy endpoint against the real CPU inference server (engineer D's
``cua-model serve`` API) behind AReaL's real ``RemotevLLMEngine``; the client is the real OpenAI SDK.

Gates: the prompt ids we train on are the ids the server tokenised; the output ids/logprobs we record are
the ones the server sampled (checked against an independent greedy call); every row's ``pixel_values``
hash-equal the processor's output for the screenshots the client sent.
"""

import base64
import io
import statistics

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.engine.vllm_remote import RemotevLLMEngine
from PIL import Image
from policy_helpers import png_data_url

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from cua_rl.trajectory import EpisodeOutcome, group_batch


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    from cua_rl.local_model import start_model_server

    server = start_model_server(tiny_model_dir, threads=1)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engine(served):
    eng = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=4, request_timeout=120,
                                                 setup_timeout=60))
    eng.initialize(addr=served.addr)
    yield eng
    eng.destroy()


def _messages(urls):
    content = [{"type": "text", "text": "Open the text editor."}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "system", "content": "You operate a computer."}, {"role": "user", "content": content}]


async def test_ids_logprobs_and_pixels_match_the_engine(engine, served, processor):
    gconfig = GenerationHyperparameters(max_new_tokens=12, greedy=True, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig, EndpointSettings(model_name="tiny"))
    urls = [png_data_url((200, 30, 30), size=(640, 400)), png_data_url((20, 120, 220), size=(500, 320))]
    try:
        from openai import AsyncOpenAI

        ep = await policy.open_episode()
        client = AsyncOpenAI(base_url=ep.base_url, api_key=ep.key, max_retries=0)
        res = await client.chat.completions.create(model="tiny", messages=_messages(urls), temperature=0.3)
        await client.close()
        (turn,) = ep.turns
        assert res.choices[0].message.content == processor.tokenizer.decode(
            [t for t in turn.output_ids if t not in policy.gconfig.stop_token_ids], skip_special_tokens=True)

        # Independent call straight to the server with the same screenshots, greedy: its own tokenisation
        # of the messages and its own sample must equal what the endpoint recorded for training.
        async with httpx.AsyncClient(timeout=120) as c:
            direct = (await c.post(served.url + "/v1/chat/completions", json={
                "messages": _messages(urls), "max_tokens": 12, "temperature": 0.0, "logprobs": True,
                "return_token_ids": True, "stop_token_ids": policy.gconfig.stop_token_ids})).json()
        assert direct["prompt_token_ids"] == turn.prompt_ids
        assert direct["choices"][0]["token_ids"] == turn.output_ids
        server_lp = [x["logprob"] for x in direct["choices"][0]["logprobs"]["content"]]
        diffs = [abs(a - b) for a, b in zip(server_lp, turn.output_logprobs)]
        print(f"GATE engine-vs-record logprob |diff| median={statistics.median(diffs):.2e} max={max(diffs):.2e}")
        assert max(diffs) < 1e-4

        # Pixel gate: the row's image tensors are the processor's output for exactly these screenshots.
        imgs = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in urls]
        tpl = [{"role": "system", "content": "You operate a computer."},
               {"role": "user", "content": [{"type": "text", "text": "Open the text editor."},
                                            {"type": "image"}, {"type": "image"}]}]
        text = processor.apply_chat_template(tpl, add_generation_prompt=True, tokenize=False)
        ref = processor(images=imgs, text=[text], return_tensors="pt")
        row = group_batch([EpisodeOutcome([turn], 1.0)], normalise=False)
        mmi = row["multi_modal_input"][0]
        assert tensor_sha256(mmi["pixel_values"]) == tensor_sha256(ref["pixel_values"])
        assert tensor_sha256(mmi["image_grid_thw"]) == tensor_sha256(ref["image_grid_thw"])
        n = len(turn.prompt_ids) + len(turn.output_ids)
        assert row["input_ids"][0, :n].tolist() == ref["input_ids"][0].tolist() + turn.output_ids
        assert row["mm_token_type_ids"][0, : len(turn.prompt_ids)].tolist() == ref["mm_token_type_ids"][0].tolist()
        assert turn.versions == {0}
    finally:
        await policy.aclose()
        await close_loop_servers()


async def test_text_only_turn_uses_the_token_id_path(engine, served, processor):
    """Without images AReaL sends our ids to /v1/completions: the server echoes exactly those ids."""
    gconfig = GenerationHyperparameters(max_new_tokens=6, greedy=True, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig)
    try:
        ep = await policy.open_episode()
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(ep.base_url + "/chat/completions", headers={"Authorization": f"Bearer {ep.key}"},
                             json={"messages": [{"role": "user", "content": "Type hello."}]})
        assert r.status_code == 200, r.text
        body = r.json()
        (turn,) = ep.turns
        ref = processor.apply_chat_template([{"role": "user", "content": "Type hello."}],
                                            add_generation_prompt=True, tokenize=False)
        assert turn.prompt_ids == processor.tokenizer(ref, add_special_tokens=False)["input_ids"]
        assert body["choices"][0]["token_ids"] == turn.output_ids and turn.multi_modal_input is None
    finally:
        await close_loop_servers()
