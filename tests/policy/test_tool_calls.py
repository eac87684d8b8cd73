"""Tool calls as OpenAI clients expect them (cua_rl/policy/tool_calls.py): with ``tools`` in the request the
endpoint answers as vLLM's own OpenAI server with ``--enable-auto-tool-choice --tool-call-parser hermes``.

- Against vLLM itself (the session's server runs vLLM's hermes parser on its chat route): the tiny model is
  taught one tool call and one closing answer (a few dozen AdamW steps on two turns), loaded into vLLM, and the
  same requests go through the official openai SDK to our endpoint and to vLLM's server, plain and streamed:
  the parsed calls, the content and the finish reason are equal; the training row holds the sampled tokens
  (the call as text); the second turn, with the call and its result in the history, has vLLM's prompt ids.
  The tiny weights are loaded back at the end.
- Our parser against vLLM's parser class on texts the model may write (unterminated, several calls, not JSON,
  no arguments), and what the endpoint refuses: ``tool_choice`` that needs constrained decoding, history
  arguments that are not JSON.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, prompt_from_messages
from cua_rl.policy.prompt import BadRequest, parse_messages
from cua_rl.policy.tool_calls import ToolRequest, parse_reply
from tests.doubles.policy_helpers import EngineDouble

TOOLS = [{"type": "function", "function": {
    "name": "click", "description": "Click a point of the screen.",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                   "required": ["x", "y"]}}}]
CALL = '<tool_call>\n{"name": "click", "arguments": {"x": 412, "y": 87}}\n</tool_call>'
DONE = "The OK button is clicked."
FIRST = [{"role": "system", "content": "You operate a computer."},
         {"role": "user", "content": [{"type": "text", "text": "Click the OK button."}]}]
TEXTS = [  # what a model may write, for the parser conformance check
    "no call at all", CALL, "I will click.\n" + CALL, CALL + "\n" + CALL.replace("412", "5"),
    '<tool_call>{"name": "click", "arguments": {"x": 1, "y": 2}}', "<tool_call>not json</tool_call>",
    '<tool_call>{"name": "click"}</tool_call>', '<tool_call>{"name": "clé", "arguments": {"t": "é ü"}}</tool_call>',
    '<tool_call>{"name": "click", "arguments": []}</tool_call> trailing', "<tool_call>",
]


# ---- pure ---------------------------------------------------------------------------------------------
def test_tool_choice_that_needs_constrained_decoding_is_refused():
    assert ToolRequest.of({"tools": TOOLS}) == ToolRequest(parse=True, parallel=True)
    assert ToolRequest.of({"tools": TOOLS, "tool_choice": "none"}).parse is False
    assert ToolRequest.of({"tool_choice": "auto"}).parse is False            # nothing to call
    assert ToolRequest.of({"tools": TOOLS, "parallel_tool_calls": False}).parallel is False
    for choice in ("required", {"type": "function", "function": {"name": "click"}}):
        with pytest.raises(BadRequest, match="constrained decoding"):
            ToolRequest.of({"tools": TOOLS, "tool_choice": choice})
    # without tools the text stays the content, whatever it holds
    assert parse_reply(CALL, ToolRequest()).content == CALL


def test_a_call_nested_thousands_deep_stays_text():
    """Issue 66: json.loads raised RecursionError on it (a 500 and a lost turn in the endpoint)."""
    deep = "<tool_call>" + "[" * 3000 + "]" * 3000 + "</tool_call>"
    reply = parse_reply(deep, ToolRequest(parse=True))
    assert reply.content == deep and reply.tool_calls == []


def test_history_tool_calls_reach_the_template_as_objects_and_bad_arguments_are_400():
    call = {"id": "c1", "type": "function", "function": {"name": "click", "arguments": '{"x": 1}'}}
    parsed = parse_messages([*FIRST, {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    assert parsed.for_template[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert parsed.for_vllm[2]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'   # vLLM converts its own
    bad = {**call, "function": {"name": "click", "arguments": "{x: 1"}}
    with pytest.raises(BadRequest, match=r"messages\[2\]\.tool_calls\[0\]\.function\.arguments is not JSON"):
        parse_messages([*FIRST, {"role": "assistant", "tool_calls": [bad]}])


async def test_streamed_tool_calls_assemble_in_the_sdk(processor):
    """Streamed and plain, through the SDK: the call, the text before it and the reason (AReaL's engine is
    the documented double here: the text is scripted)."""
    from openai import AsyncOpenAI

    engine = EngineDouble(processor.tokenizer, text="Clicking.\n" + CALL)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer,
                            GenerationHyperparameters(max_new_tokens=64, max_tokens=4096), EndpointSettings())
    try:
        ep = await policy.open_episode()
        client = AsyncOpenAI(base_url=ep.base_url, api_key=ep.key, max_retries=0)
        assert await _streamed(client, "policy", messages=FIRST, tools=TOOLS) == \
            ("Clicking.\n", [("click", {"x": 412, "y": 87})], "tool_calls")
        plain = (await client.chat.completions.create(model="policy", messages=FIRST, tools=TOOLS)).choices[0]
        await client.close()
        assert (plain.message.content, _calls(plain.message), plain.finish_reason) == \
            ("Clicking.\n", [("click", {"x": 412, "y": 87})], "tool_calls")
        # the row keeps the sampled tokens: the call as the model wrote it
        assert len(ep.turns) == 2 and all(CALL in processor.tokenizer.decode(t.output_ids) for t in ep.turns)
    finally:
        await close_loop_servers()


# ---- against vLLM ---------------------------------------------------------------------------------------
def test_the_parser_is_vllms_hermes_parser(processor):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    theirs = Hermes2ProToolParser(processor.tokenizer)
    request = ChatCompletionRequest(messages=FIRST, tools=TOOLS)
    for text in TEXTS:
        ref = theirs.extract_tool_calls(text, request)
        ours = parse_reply(text, ToolRequest.of({"tools": TOOLS}))
        assert ours.content == ref.content, text
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in ours.tool_calls] == \
            [(c.function.name, c.function.arguments) for c in ref.tool_calls], text


def _teach(tiny_model_dir: str, processor, out) -> None:
    """The tiny model, trained until its greedy answers are CALL to FIRST and DONE once the call's result is
    in the history (the prompts are the endpoint's own, tools included)."""
    from transformers import AutoModelForImageTextToText

    tok = processor.tokenizer
    settings = EndpointSettings()
    second = [*FIRST, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "click", "arguments": '{"x": 412, "y": 87}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "clicked at (412, 87)"}]
    pairs = [(prompt_from_messages(processor, tok, settings, msgs, TOOLS).input_ids,
              tok(answer, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")])
             for msgs, answer in ((FIRST, CALL), (second, DONE))]
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(300):
        learned = True
        for prompt, answer in pairs:
            ids = torch.tensor([prompt + answer])
            labels = ids.clone()
            labels[0, :len(prompt)] = -100
            result = model(input_ids=ids, labels=labels)
            result.loss.backward()
            learned &= result.logits[0, len(prompt) - 1:-1].argmax(-1).tolist() == answer
        if learned:
            break
        opt.step()
        opt.zero_grad()
    assert learned, f"the tiny model did not learn the answers in {step + 1} steps"
    model.save_pretrained(out)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


async def _streamed(client, model: str, **kw) -> tuple[str | None, list[tuple[str, dict]], str]:
    """A streamed answer put together as a client does: content joined, tool-call fragments joined by index."""
    content, calls, finish = None, {}, None
    async for chunk in await client.chat.completions.create(model=model, stream=True, **kw):
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        if delta.content:
            content = (content or "") + delta.content
        for tc in delta.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
    return content, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], finish


async def test_the_sdk_gets_the_same_tool_calls_from_the_endpoint_as_from_vllm(engine, vllm_server, processor,
                                                                                 tiny_model_dir, tmp_path):
    from openai import AsyncOpenAI

    _teach(tiny_model_dir, processor, tmp_path / "taught")
    gconfig = GenerationHyperparameters(max_new_tokens=48, greedy=True, max_tokens=4096)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig, EndpointSettings(model_name="tiny"))
    served = httpx.get(vllm_server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    vllm = AsyncOpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)
    direct = dict(temperature=0.0, max_tokens=48, extra_body={"return_token_ids": True,
                                                             "stop_token_ids": policy.gconfig.stop_token_ids})
    r = httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": str(tmp_path / "taught")},
                   timeout=300)
    assert r.status_code == 200 and r.json()["success"], r.text
    try:
        ep = await policy.open_episode()
        ours = AsyncOpenAI(base_url=ep.base_url, api_key=ep.key, max_retries=0)
        # turn 1: the call, plain and streamed
        mine = (await ours.chat.completions.create(model="tiny", messages=FIRST, tools=TOOLS)).choices[0]
        reference = await vllm.chat.completions.create(model=served, messages=FIRST, tools=TOOLS, **direct)
        theirs = reference.choices[0]
        assert _calls(theirs.message) == [("click", {"x": 412, "y": 87})], theirs   # vLLM parsed the taught call
        assert _calls(mine.message) == _calls(theirs.message)
        assert (mine.message.content, mine.finish_reason) == (theirs.message.content, theirs.finish_reason) \
            == (None, "tool_calls")
        assert await _streamed(ours, "tiny", messages=FIRST, tools=TOOLS) == \
            await _streamed(vllm, served, messages=FIRST, tools=TOOLS, **direct)
        # the training rows hold the sampled tokens, the call as text, and the same tokens vLLM sampled
        first_turn = ep.turns[0]
        assert first_turn.prompt_ids == reference.model_extra["prompt_token_ids"]
        assert first_turn.output_ids == theirs.model_extra["token_ids"]
        assert CALL in processor.tokenizer.decode(first_turn.output_ids)
        # turn 2: the call and its result in the history, as an OpenAI client sends them back
        history = [*FIRST, mine.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": mine.message.tool_calls[0].id, "content": "clicked at (412, 87)"}]
        raw = await ours.chat.completions.with_raw_response.create(model="tiny", messages=history, tools=TOOLS)
        mine2 = raw.parse()
        body = json.loads(raw.text)
        theirs2 = await vllm.chat.completions.create(model=served, messages=history, tools=TOOLS, **direct)
        assert body["prompt_token_ids"] == theirs2.model_extra["prompt_token_ids"]   # the template took the history alike
        assert mine2.choices[0].message.content == theirs2.choices[0].message.content == DONE
        assert mine2.choices[0].finish_reason == theirs2.choices[0].finish_reason == "stop"
        assert not mine2.choices[0].message.tool_calls and ep.prompt_mismatches == 0 and ep.verified_turns == 3
        await ours.close()
    finally:
        await vllm.close()
        await close_loop_servers()
        r = httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": tiny_model_dir}, timeout=300)
        assert r.status_code == 200, r.text
