"""Request/record plumbing of the policy endpoint, with an engine test double.

The engine here is ``EngineDouble``, a scripted stand-in for AReaL's ``InferenceEngine.agenerate``: these
tests check only what the endpoint does around the engine (auth, parsing, processor, recording, the reply,
straddle handling). The correctness gates against the real CPU inference server live in test_gates.py.
"""

import base64
import io

import httpx
import pytest
from aiohttp import web
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from cua_rl.http.serve import free_port
from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from tests.doubles.policy_helpers import EngineDouble, png_data_url


def _user(*parts):
    return {"role": "user", "content": list(parts)}


def _img(url):
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture
async def endpoint(processor):
    engine = EngineDouble(processor.tokenizer)
    gconfig = GenerationHyperparameters(max_new_tokens=32, temperature=0.7, max_tokens=4096)
    ep = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig,
                        EndpointSettings(model_name="tiny", max_screenshots_in_history=2))
    yield ep
    await ep.aclose()
    await close_loop_servers()


async def _post(ep, body, key):
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(ep.base_url + "/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"} if key else {})


async def test_records_processor_exact_turn_and_answers_like_vllm(endpoint, processor):
    ep = await endpoint.open_episode()
    url = png_data_url()
    messages = [{"role": "system", "content": "You operate a computer."},
                _user({"type": "text", "text": "Open the editor."}, _img(url))]
    r = await _post(ep, {"model": "tiny", "messages": messages, "temperature": 0.0, "max_tokens": 5}, ep.key)
    assert r.status_code == 200, r.text
    body = r.json()
    # independent processor run on the same screenshot
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
    tpl = [messages[0], {"role": "user", "content": [{"type": "text", "text": "Open the editor."}, {"type": "image"}]}]
    text = processor.apply_chat_template(tpl, add_generation_prompt=True, tokenize=False)
    ref = processor(images=[img], text=[text], return_tensors="pt")
    (turn,) = ep.turns
    assert turn.prompt_ids == ref["input_ids"][0].tolist()
    assert turn.prompt_mm_token_type_ids == ref["mm_token_type_ids"][0].tolist()
    assert sum(turn.prompt_mm_token_type_ids) == int(ref["image_grid_thw"].prod()) // 4  # expanded tokens
    assert tensor_sha256(turn.multi_modal_input["pixel_values"]) == tensor_sha256(ref["pixel_values"])
    assert turn.output_ids == endpoint.engine.out and turn.output_versions == [0] * len(turn.output_ids)
    # the trainer's sampling settings reached the engine, not the agent's
    req = endpoint.engine.requests[0]
    assert req.gconfig.temperature == 0.7 and req.gconfig.max_new_tokens == 32 and req.gconfig.n_samples == 1
    assert processor.tokenizer.eos_token_id in req.gconfig.stop_token_ids
    assert {"temperature", "max_tokens"} <= ep.ignored_params
    # images go to the engine as the agent's own bytes, and as vLLM chat messages
    assert req.image_data == [url.split(",", 1)[1]]
    assert req.vision_msg_vllm[0][1]["content"][1]["type"] == "image_url"
    # the reply: text without the stop token, vLLM field names for ids and logprobs
    choice = body["choices"][0]
    assert choice["message"]["content"] == "click <tool_call>ok</tool_call>"
    assert choice["token_ids"] == turn.output_ids
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [-0.5] * len(turn.output_ids)
    assert body["prompt_token_ids"] == turn.prompt_ids and body["model"] == "tiny"
    assert body["usage"]["completion_tokens"] == len(turn.output_ids)


async def test_auth_models_and_closed_episodes(endpoint):
    ep = await endpoint.open_episode()
    other = await endpoint.open_episode()
    assert ep.key != other.key and ep.base_url == other.base_url
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    assert (await _post(ep, msg, None)).status_code == 401
    assert (await _post(ep, msg, "cua-wrong")).status_code == 401
    async with httpx.AsyncClient() as c:
        models = (await c.get(ep.base_url + "/models")).json()
    assert models["data"][0]["id"] == "tiny"
    assert (await _post(ep, msg, other.key)).status_code == 200
    assert len(other.turns) == 1 and ep.turns == []
    endpoint.close_episode(other)
    assert (await _post(ep, msg, other.key)).status_code == 401
    assert len(other.turns) == 1


@pytest.mark.parametrize("bad, why", [
    ({"messages": []}, "non-empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [_user(_img("data:image/png;base64,!!!"))]}, "base64"),
    ({"messages": [_user(_img("data:image/png;base64," + base64.b64encode(b"not an image").decode()))]},
     "decodable"),
    ({"messages": [_user(_img("file:///etc/passwd"))]}, "paths are never read"),
    ({"messages": [_user({"type": "audio", "audio": "x"})]}, "unsupported"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n must be 1"),
])
async def test_bad_requests_get_400_with_reason_and_record_nothing(endpoint, bad, why):
    ep = await endpoint.open_episode()
    r = await _post(ep, bad, ep.key)
    assert r.status_code == 400 and why in r.json()["error"]["message"]
    assert ep.turns == [] and ep.failed_turns == 0


async def test_old_screenshots_are_dropped_and_large_ones_shrunk(processor):
    engine = EngineDouble(processor.tokenizer)
    ep_ = PolicyEndpoint(engine, processor, processor.tokenizer, GenerationHyperparameters(max_new_tokens=8),
                         EndpointSettings(max_screenshots_in_history=2, max_pixels=100 * 100))
    try:
        ep = await ep_.open_episode()
        urls = [png_data_url((i * 60, 20, 20), size=(400, 300)) for i in range(3)]
        msgs = [_user(_img(urls[0])), {"role": "assistant", "content": "a", "tool_calls": None},
                _user(_img(urls[1])), {"role": "assistant", "content": "b"}, _user(_img(urls[2]))]
        r = await _post(ep, {"messages": msgs}, ep.key)
        assert r.status_code == 200, r.text
        req = engine.requests[0]
        assert len(req.image_data) == 2 and ep.turns[0].n_images == 2
        sent = [Image.open(io.BytesIO(base64.b64decode(b))) for b in req.image_data]
        assert all(im.size[0] * im.size[1] <= 100 * 100 for im in sent)
        assert sent[0].getpixel((200 * 100 // 400 + 5, 40)) == (60, 20, 20)  # the 2nd screenshot, resized
    finally:
        await ep_.aclose()
        await close_loop_servers()


async def _image_server(routes):
    """A real HTTP server on loopback serving ``routes`` (path -> body); (runner, port, the paths asked for)."""
    asked = []

    def serve(body):
        async def handler(request):
            asked.append(request.path)
            return web.Response(body=body, content_type="image/png")
        return handler

    app = web.Application()
    for path, body in routes.items():
        app.router.add_get(path, serve(body))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], asked


async def test_remote_image_urls_are_refused_by_default_alike_for_open_and_closed_ports(endpoint, tmp_path):
    """Issue 66: by default the endpoint makes no request for an http(s) image URL (it fetched any, and its
    errors told an open port from a closed one); the refusal reads the same for both. An image given as a
    path is never read, even a real PNG file."""
    png = base64.b64decode(png_data_url().split(",", 1)[1])
    (tmp_path / "shot.png").write_bytes(png)
    runner, port, asked = await _image_server({"/shot.png": png})
    try:
        ep = await endpoint.open_episode()
        answers = []
        for url in (f"http://127.0.0.1:{port}/shot.png", f"http://127.0.0.1:{free_port()}/shot.png",
                    f"https://127.0.0.1:{port}/shot.png", str(tmp_path / "shot.png"), f"file://{tmp_path}/shot.png",
                    "shot.png", "~/shot.png"):
            r = await _post(ep, {"messages": [_user(_img(url))]}, ep.key)
            assert r.status_code == 400, (url, r.text)
            answers.append(r.json()["error"]["message"])
        assert len(set(answers)) == 1 and "data: URL" in answers[0], answers
        assert asked == [], "the endpoint made a request for a refused image URL"
        assert ep.turns == [] and endpoint.engine.requests == []
    finally:
        await runner.cleanup()


async def test_http_image_urls_are_fetched_with_caps_when_allowed(endpoint):
    big = b"x" * 4096
    png = base64.b64decode(png_data_url().split(",", 1)[1])
    runner, port, _asked = await _image_server({"/shot.png": png, "/big": big})
    allowed = dict(allowed_image_hosts=["127.0.0.1"])
    try:
        ok_ep = PolicyEndpoint(endpoint.engine, endpoint.processor, endpoint.tokenizer,
                               GenerationHyperparameters(), EndpointSettings(**allowed))
        ep = await ok_ep.open_episode()
        ok = await _post(ep, {"messages": [_user(_img(f"http://127.0.0.1:{port}/shot.png"))]}, ep.key)
        assert ok.status_code == 200, ok.text
        assert endpoint.engine.requests[-1].image_data == [base64.b64encode(png).decode()]
        await ok_ep.aclose()
        small = PolicyEndpoint(endpoint.engine, endpoint.processor, endpoint.tokenizer,
                               GenerationHyperparameters(), EndpointSettings(image_fetch_max_bytes=1024, **allowed))
        ep2 = await small.open_episode()
        # too large, not found, nobody listening: one answer, so none tells an open port from a closed one
        failed = set()
        for url in (f"http://127.0.0.1:{port}/big", f"http://127.0.0.1:{port}/missing",
                    f"http://127.0.0.1:{free_port()}/shot.png"):
            r = await _post(ep2, {"messages": [_user(_img(url))]}, ep2.key)
            assert r.status_code == 400, r.text
            failed.add(r.json()["error"]["message"])
        assert len(failed) == 1 and "could not be fetched" in failed.pop()
        await small.aclose()
    finally:
        await runner.cleanup()


async def test_a_tool_call_nested_thousands_deep_is_answered_as_text(processor):
    """Issue 66: the model wrote a <tool_call> 3000 levels deep; the endpoint answered 500 and lost the sampled
    turn uncounted. It is an answer with that text as the content, and the turn is recorded."""
    deep = "<tool_call>" + "[" * 3000 + "]" * 3000 + "</tool_call>"
    engine = EngineDouble(processor.tokenizer, text=deep)
    ep_ = PolicyEndpoint(engine, processor, processor.tokenizer, GenerationHyperparameters(max_new_tokens=8))
    tools = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object"}}}]
    try:
        ep = await ep_.open_episode()
        r = await _post(ep, {"messages": [{"role": "user", "content": "hi"}], "tools": tools}, ep.key)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["tool_calls"] == [] and message["content"].startswith("<tool_call>[[[")
        assert len(ep.turns) == 1 and ep.failed_turns == 0
    finally:
        await close_loop_servers()


async def test_vllm_output_straddling_a_weight_update_is_regenerated(processor, caplog):
    """...and said at INFO: an interrupted output is normal under async RL (the summary counts them), not a
    warning the console shows per episode."""
    import logging

    caplog.set_level(logging.INFO, logger="cua_rl.policy.endpoint")
    n = len(processor.tokenizer("x", add_special_tokens=False)["input_ids"])
    engine = EngineDouble(processor.tokenizer, text="x")
    mixed = [0] * n + [1]  # the last token came from the next policy version
    engine.versions = [mixed, None]
    ep_ = PolicyEndpoint(engine, processor, processor.tokenizer, GenerationHyperparameters(max_new_tokens=4),
                         EndpointSettings(backend="vllm", max_straddle_retries=1))
    try:
        ep = await ep_.open_episode()
        msg = {"messages": [{"role": "user", "content": "hi"}]}
        assert (await _post(ep, msg, ep.key)).status_code == 200
        assert ep.dropped_straddles == 1 and len(engine.requests) == 2 and ep.turns[0].versions == {0}
        said = [r for r in caplog.records if "output was interrupted" in r.getMessage()]
        assert [r.levelname for r in said] == ["INFO"], said
        engine.versions = [mixed, mixed]
        r = await _post(ep, msg, ep.key)
        assert r.status_code == 503 and ep.failed_turns == 1 and len(ep.turns) == 1
        # SGLang resumes from token ids, so mixed versions there are a legitimate partial rollout
        ep_.backend = "sglang"
        engine.versions = [mixed]
        assert (await _post(ep, msg, ep.key)).status_code == 200
        assert ep.turns[-1].versions == {0, 1}
    finally:
        await close_loop_servers()


async def test_vision_token_outputs_and_straddles_each_spend_their_own_budget(processor):
    """An output holding a vision placeholder token is sampled again under ``max_vision_token_resamples`` and a
    straddle under ``max_straddle_retries``: a turn that draws both is answered while each cause stays in its
    budget (with one budget shared, two placeholder draws and a straddle lost the fleet test's turn), and a 503
    when either runs out."""
    image_id = processor.image_token_id
    n = len(processor.tokenizer("x", add_special_tokens=False)["input_ids"])

    class Scripted(EngineDouble):   # one output per call: "x", or "x" then an image placeholder token
        def __init__(self, tokenizer, script):
            super().__init__(tokenizer, text="x")
            self.clean, self.script = list(self.out), list(script)

        async def agenerate(self, req):
            kind = self.script.pop(0)
            self.out = self.clean[:-1] + [image_id, self.clean[-1]] if kind == "vision" else list(self.clean)
            self.versions = [[0] * n + [1]] if kind == "straddle" else []
            return await super().agenerate(req)

    msg = {"messages": [{"role": "user", "content": "hi"}]}
    cases = {  # script, answered, calls
        "both within": (["vision", "straddle", "vision", "ok"], 200, 4),
        "placeholders run out": (["vision"] * 3, 503, 3),
        "straddles run out": (["straddle", "vision", "straddle"], 503, 3),
    }
    for name, (script, status, calls) in cases.items():
        engine = Scripted(processor.tokenizer, script)
        ep_ = PolicyEndpoint(engine, processor, processor.tokenizer, GenerationHyperparameters(max_new_tokens=4),
                             EndpointSettings(backend="vllm", max_straddle_retries=1, max_vision_token_resamples=2))
        try:
            ep = await ep_.open_episode()
            r = await _post(ep, msg, ep.key)
            assert (r.status_code, len(engine.requests)) == (status, calls), name
            assert ep.vision_token_outputs == script.count("vision"), name
            assert ep.dropped_straddles == script.count("straddle"), name
            if status == 200:
                assert image_id not in ep.turns[0].output_ids and ep.turns[0].versions == {0}
        finally:
            await close_loop_servers()
    with pytest.raises(ValueError, match="max_vision_token_resamples"):
        EndpointSettings(max_vision_token_resamples=-1)


async def test_engine_failure_is_a_503_and_counted(processor):
    class Broken(EngineDouble):
        async def agenerate(self, req):
            raise ConnectionError("server gone")

    ep_ = PolicyEndpoint(Broken(processor.tokenizer), processor, processor.tokenizer, GenerationHyperparameters())
    try:
        ep = await ep_.open_episode()
        r = await _post(ep, {"messages": [{"role": "user", "content": "hi"}]}, ep.key)
        assert r.status_code == 503 and ep.failed_turns == 1 and ep.turns == []
    finally:
        await close_loop_servers()


async def test_engine_shutting_down_is_a_503_without_an_error_log(processor, caplog):
    """AReaL's destroy() clears ``initialized`` before it closes the sessions of rollouts still in flight:
    the failure that follows is the end of a run, logged at INFO (a clean shutdown printed ERROR lines)."""
    class Stopping(EngineDouble):
        initialized = False

        async def agenerate(self, req):
            raise RuntimeError("Session is closed")

    ep_ = PolicyEndpoint(Stopping(processor.tokenizer), processor, processor.tokenizer, GenerationHyperparameters())
    try:
        ep = await ep_.open_episode()
        with caplog.at_level("INFO", logger="cua_rl.policy.endpoint"):
            r = await _post(ep, {"messages": [{"role": "user", "content": "hi"}]}, ep.key)
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
        assert ep.failed_turns == 1 and ep.turns == []
        assert not [rec for rec in caplog.records if rec.levelname == "ERROR"]
        assert any("shutting down" in rec.getMessage() for rec in caplog.records)
    finally:
        await close_loop_servers()


async def test_openai_sdk_client_plain_and_streaming(endpoint):
    from openai import AsyncOpenAI

    ep = await endpoint.open_episode()
    client = AsyncOpenAI(base_url=ep.base_url, api_key=ep.key, max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    res = await client.chat.completions.create(
        model="tiny", temperature=0, logprobs=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "look"},
                                               {"type": "image_url", "image_url": {"url": png_data_url()}}]}])
    assert res.choices[0].message.content == "click <tool_call>ok</tool_call>"
    assert len(res.choices[0].logprobs.content) == len(ep.turns[0].output_ids)
    stream = await client.chat.completions.create(model="tiny", stream=True,
                                                  messages=[{"role": "user", "content": "again"}])
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == res.choices[0].message.content
    assert len(ep.turns) == 2
    await client.close()


async def test_tools_are_templated_but_refused_with_images_on_vllm(endpoint):
    tools = [{"type": "function", "function": {"name": "computer_use", "description": "act",
                                                "parameters": {"type": "object", "properties": {}}}}]
    ep = await endpoint.open_episode()
    r = await _post(ep, {"messages": [{"role": "user", "content": "hi"}], "tools": tools}, ep.key)
    assert r.status_code == 200, r.text
    with_tools = endpoint.engine.requests[-1].input_ids
    r = await _post(ep, {"messages": [{"role": "user", "content": "hi"}]}, ep.key)
    assert len(with_tools) > len(endpoint.engine.requests[-1].input_ids)  # the tool block is in the prompt
    r = await _post(ep, {"messages": [_user(_img(png_data_url()))], "tools": tools}, ep.key)
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]


def test_every_vllm_request_pins_neutral_sampling():
    """AReaL's payload omits the penalties and min_p, which vLLM would then take from the checkpoint's
    generation_config.json: the proving backend sends them neutral on every request, so the behaviour policy
    is the plain distribution at gconfig's temperature that the trainer recomputes."""
    from areal.api.io_struct import ModelRequest
    from areal.engine.vllm_remote import VLLMBackend

    from cua_rl.policy.vllm_proof import NEUTRAL_SAMPLING, ProvingBackend

    req = ModelRequest(input_ids=[1, 2, 3], gconfig=GenerationHyperparameters(max_new_tokens=4))
    plain = VLLMBackend().build_generation_request(req, False, 0).payload
    assert not set(NEUTRAL_SAMPLING) - {"frequency_penalty"} & set(plain), "AReaL now sends them: recheck"
    pinned = ProvingBackend(VLLMBackend()).build_generation_request(req, False, 0).payload
    assert {k: pinned[k] for k in NEUTRAL_SAMPLING} == NEUTRAL_SAMPLING


def test_an_unprovable_vllm_engine_is_refused_unless_opted_out(processor):
    """On vLLM the prompt proof is what makes the trained ids the served ones: an engine it cannot wrap is an
    error at start, not a warning, unless policy.require_prompt_proof is false."""
    from areal.api.cli_args import InferenceEngineConfig

    class RemotevLLMEngine(EngineDouble):               # AReaL's vLLM engine, but no VLLMBackend inside to wrap
        config = InferenceEngineConfig(backend="vllm:d1")

    engine = RemotevLLMEngine(processor.tokenizer)
    gconfig = GenerationHyperparameters(max_new_tokens=8)
    with pytest.raises(RuntimeError, match="require_prompt_proof"):
        PolicyEndpoint(engine, processor, processor.tokenizer, gconfig, EndpointSettings(backend="vllm"))
    unproved = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig,
                              EndpointSettings(backend="vllm", require_prompt_proof=False))
    assert not unproved.proves_prompts


async def test_right_data_9_an_overlong_prompt_is_context_length_exceeded_on_the_wire(endpoint):
    """A prompt at or over ``gconfig.max_tokens`` is answered as OpenAI answers a request over the model's context
    (400, error code ``context_length_exceeded``), never generated or recorded, and it ends the episode: every
    later request of the episode gets the same answer (a shorter one too), so an agent cannot play on past it."""
    ep = await endpoint.open_episode()
    short = {"messages": [_user({"type": "text", "text": "hi"})]}
    assert (await _post(ep, short, ep.key)).status_code == 200
    endpoint.gconfig = endpoint.gconfig.new(max_tokens=len(ep.turns[0].prompt_ids) + 2)
    longer = {"messages": [_user({"type": "text", "text": "hi " * 40})]}
    for body in (longer, short):
        r = await _post(ep, body, ep.key)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert len(ep.turns) == 1 and len(endpoint.engine.requests) == 1 and ep.failed_turns == 0
    assert endpoint.totals["context_overflows"] == 1 and ep.overflow


def test_right_data_6_areals_real_vllm_engine_unproved_is_refused(processor):
    """The workflow gets AReaL's ``RemoteInfEngine`` (its class name names no backend), configured for vLLM
    (``rollout.backend: vllm:...``). One whose vLLM backend the prompt proof cannot wrap (here AReaL's
    ``VLLMBackend`` under another class name, as another AReaL version may have it) must be refused at start:
    the class-name check it replaces ("vllm" in the engine's class name) would only have warned."""
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine.sglang_remote import SGLangBackend
    from areal.engine.vllm_remote import VLLMBackend
    from areal.infra.remote_inf_engine import RemoteInfEngine

    from cua_rl.policy.endpoint import engine_kind

    class AnotherVLLMBackend(VLLMBackend):            # vllm_proof.install wraps only a VLLMBackend
        pass

    engine = RemoteInfEngine(InferenceEngineConfig(backend="vllm:d4p1t1"), AnotherVLLMBackend())  # no server
    assert "vllm" not in type(engine).__name__.lower()                    # what the old check looked at
    assert engine_kind(engine) == "vllm"
    gconfig = GenerationHyperparameters(max_new_tokens=8)
    with pytest.raises(RuntimeError, match="require_prompt_proof"):
        PolicyEndpoint(engine, processor, processor.tokenizer, gconfig)
    unproved = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig,
                              EndpointSettings(require_prompt_proof=False))
    assert unproved.backend == "vllm" and not unproved.proves_prompts
    # AReaL's own VLLMBackend is wrapped and proves; an SGLang engine is known as such (no proof needed)
    proved = PolicyEndpoint(RemoteInfEngine(InferenceEngineConfig(backend="vllm:d1"), VLLMBackend()), processor,
                            processor.tokenizer, gconfig)
    assert proved.backend == "vllm" and proved.proves_prompts
    sglang = RemoteInfEngine(InferenceEngineConfig(backend="sglang:d2"), SGLangBackend())
    assert PolicyEndpoint(sglang, processor, processor.tokenizer, gconfig).backend == "sglang"
    assert engine_kind(EngineDouble(processor.tokenizer)) is None        # an engine that does not say: warned


def test_an_agent_on_another_host_is_given_an_address_it_can_reach():
    """The endpoint used to bind and advertise 127.0.0.1 whatever the agent's URL: an agent service on another
    host then called its own loopback and every turn failed. By default it binds loopback only for an agent
    on this machine's loopback, and otherwise every interface, advertising the address of the interface
    that routes to the agent's host; explicit settings win."""
    import socket

    from cua_rl.policy.endpoint import endpoint_hosts, route_address

    auto = EndpointSettings()
    assert endpoint_hosts(auto, "http://127.0.0.1:3000") == ("127.0.0.1", "127.0.0.1")
    assert endpoint_hosts(auto, "http://localhost:3000") == ("127.0.0.1", "127.0.0.1")
    assert endpoint_hosts(auto) == ("127.0.0.1", "127.0.0.1")        # no agent URL: this machine's
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:     # this machine's address on its default route
        try:
            probe.connect(("192.0.2.1", 9))
            mine = probe.getsockname()[0]
        except OSError:
            mine = None
    if mine and not mine.startswith("127."):
        bind, advertised = endpoint_hosts(auto, f"http://{mine}:3000")
        assert bind == "0.0.0.0" and advertised == mine == route_address(mine)
    assert endpoint_hosts(EndpointSettings(bind_host="0.0.0.0", advertised_host="policy.example"),
                          "http://agent.example:3000") == ("0.0.0.0", "policy.example")
    assert endpoint_hosts(EndpointSettings(bind_host="10.1.2.3"), "http://agent.example:3000") == ("10.1.2.3",
                                                                                                  "10.1.2.3")


async def test_ignored_sampling_fields_are_logged_once_per_process(endpoint, caplog, monkeypatch):
    """Our agent sends temperature/top_p/max_tokens on every turn of every episode (informational): the endpoint
    says once that it ignores them, not once per episode (the console and rollout.log had a line per episode)."""
    import logging

    from cua_rl.policy import endpoint as endpoint_module

    monkeypatch.setattr(endpoint_module, "_IGNORED_LOGGED", set())
    caplog.set_level(logging.INFO, logger="cua_rl.policy.endpoint")
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.0, "max_tokens": 5, "top_p": 1.0}
    for _ in range(3):
        ep = await endpoint.open_episode()
        assert (await _post(ep, body, ep.key)).status_code == 200
        assert {"temperature", "max_tokens", "top_p"} <= ep.ignored_params   # still recorded per episode
    said = [r for r in caplog.records if "ignoring client fields" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    ep = await endpoint.open_episode()   # a field not seen before is said once more
    assert (await _post(ep, {**body, "seed": 3}, ep.key)).status_code == 200
    said = [r.getMessage() for r in caplog.records if "ignoring client fields" in r.getMessage()]
    assert len(said) == 2 and "['seed']" in said[1], said


async def test_a_held_call_waits_for_its_release_and_a_closed_episode_lets_it_go(endpoint):
    """``PolicyEndpoint.hold`` (a tree group forks the desktop while the parent's next call waits): the call of
    the held turn waits, ``arrived`` says it came, ``release`` lets it generate and be recorded; other turns
    pass; closing the episode lets a held call go with a 503 and records nothing; a turn already recorded
    cannot be held."""
    import asyncio

    ep = await endpoint.open_episode()
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    hold = endpoint.hold(ep, 2)
    assert (await _post(ep, msg, ep.key)).status_code == 200          # turn 1 is not held
    call = asyncio.create_task(_post(ep, msg, ep.key))
    assert await hold.arrived(10.0)
    await asyncio.sleep(0.3)
    assert not call.done() and len(ep.turns) == 1
    hold.release()
    assert (await call).status_code == 200 and len(ep.turns) == 2 and ep.hold is None
    with pytest.raises(ValueError, match="cannot be held"):
        endpoint.hold(ep, 2)
    late = endpoint.hold(ep, 3)
    assert not await late.arrived(0.1)                                 # nothing came: the caller knows
    call = asyncio.create_task(_post(ep, msg, ep.key))
    assert await late.arrived(10.0)
    endpoint.close_episode(ep)
    answer = await call
    assert answer.status_code == 503 and "held" in answer.text and len(ep.turns) == 2


async def test_a_call_held_after_sampling_shows_its_turn_and_answers_once_released(endpoint):
    """``hold(..., sampled=True)`` (a tree group that forks where the policy is unsure, issue 90): the held call's
    turn is sampled first and shown (``Hold.sampled``, its logprobs) while the answer waits, so the agent has not
    acted; released, it answers and the turn is recorded; closed meanwhile, a 503 and nothing recorded."""
    import asyncio

    ep = await endpoint.open_episode()
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    hold = endpoint.hold(ep, 1, sampled=True)
    call = asyncio.create_task(_post(ep, msg, ep.key))
    assert await hold.arrived(10.0)
    assert hold.sampled is not None and hold.sampled.output_logprobs and not call.done() and ep.turns == []
    hold.release()
    assert (await call).status_code == 200 and ep.turns == [hold.sampled]
    again = endpoint.hold(ep, 2, sampled=True)
    call = asyncio.create_task(_post(ep, msg, ep.key))
    assert await again.arrived(10.0) and again.sampled is not None
    endpoint.close_episode(ep)
    answer = await call
    assert answer.status_code == 503 and "held" in answer.text and len(ep.turns) == 1


async def test_gpu_first_try_3_an_image_host_outside_the_allow_list_is_refused_naming_it(endpoint):
    """``policy.allowed_image_hosts`` is AReaL's example's ``--allowed-media-domains``: a listed host's screenshot is
    fetched, any other host is refused without a request, the refusal naming it (``allow_http_images`` allowed
    every host once on)."""
    png = base64.b64decode(png_data_url().split(",", 1)[1])
    runner, port, asked = await _image_server({"/shot.png": png})
    listed = PolicyEndpoint(endpoint.engine, endpoint.processor, endpoint.tokenizer, GenerationHyperparameters(),
                            EndpointSettings(allowed_image_hosts=["LocalHost"]))
    try:
        ep = await listed.open_episode()
        refused = await _post(ep, {"messages": [_user(_img(f"http://127.0.0.1:{port}/shot.png"))]}, ep.key)
        assert refused.status_code == 400, refused.text
        assert "'127.0.0.1' is not in policy.allowed_image_hosts (localhost)" in refused.json()["error"]["message"]
        assert asked == [], "a host outside the list was asked for its image"
        ok = await _post(ep, {"messages": [_user(_img(f"http://localhost:{port}/shot.png"))]}, ep.key)
        assert ok.status_code == 200, ok.text
        assert asked, "the listed host's image was not fetched"
        with pytest.raises(ValueError, match="not a host name"):
            EndpointSettings(allowed_image_hosts=["http://screenshots.example.com/"])
    finally:
        await listed.aclose()
        await runner.cleanup()
