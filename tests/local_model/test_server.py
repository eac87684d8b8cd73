"""The CPU server over real HTTP: vLLM response shapes (parsed by AReaL's own VLLMBackend), sampling,
logprob convention, image chat prompts, concurrency, pause/abort, disk weight updates, bad input."""

from __future__ import annotations

import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from areal.api import ModelRequest
from areal.api.cli_args import GenerationHyperparameters
from areal.engine.vllm_remote import VLLMBackend
from lm_helpers import image_messages, png_b64, screenshot
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

BACKEND = VLLMBackend()


def post(srv, path, body, timeout=120):
    return httpx.post(srv.url + path, json=body, timeout=timeout)


def areal_payload(input_ids, **g):
    gconfig = GenerationHyperparameters(**{"max_new_tokens": 8, "temperature": 1.0, **g})
    return BACKEND.build_generation_request(ModelRequest(input_ids=list(input_ids), gconfig=gconfig),
                                            with_lora=False, version=0)


@pytest.fixture(scope="module")
def prompt_ids(tiny_dir):
    proc = AutoProcessor.from_pretrained(tiny_dir)
    text = proc.apply_chat_template([{"role": "user", "content": "Type hello world and press Enter."}],
                                    add_generation_prompt=True, tokenize=False)
    return proc.tokenizer.encode(text)


def test_health_models_version(served):
    assert httpx.get(served.url + "/health").status_code == 200
    models = httpx.get(served.url + "/v1/models").json()
    assert models["data"][0]["root"] == str(served.engine.model_dir)
    assert httpx.get(served.url + "/version").json()["version"] == 0


def test_completions_parse_with_areals_backend(served, prompt_ids):
    req = areal_payload(prompt_ids, max_new_tokens=12, temperature=0.8)
    assert req.endpoint == "/v1/completions"
    resp = post(served, req.endpoint, req.payload)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    parsed = BACKEND.parse_generation_response(body)
    assert parsed.output_tokens == body["choices"][0]["token_ids"]
    assert len(parsed.output_tokens) == len(parsed.output_logprobs) >= 1
    assert parsed.stop_reason in ("length", "stop")
    assert all(lp <= 0 for lp in parsed.output_logprobs)
    assert body["choices"][0]["prompt_token_ids"] == prompt_ids


def test_logprobs_are_full_vocab_at_temperature(served, tiny_dir, prompt_ids):
    """Server logprobs == log_softmax(logits / T) of a plain full-sequence forward (the trainer's view),
    even with top_k/top_p active; and they differ from the T=1 values (the convention is observable)."""
    T = 0.7
    req = areal_payload(prompt_ids, max_new_tokens=10, temperature=T, top_k=5, top_p=0.9)
    body = post(served, req.endpoint, {**req.payload, "seed": 3}).json()
    out = BACKEND.parse_generation_response(body)
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir).eval()
    seq = torch.tensor([prompt_ids + out.output_tokens])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0, len(prompt_ids) - 1:-1].float()
    targets = torch.tensor(out.output_tokens)
    ref_t = torch.log_softmax(logits / T, -1).gather(-1, targets[:, None])[:, 0]
    ref_1 = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    got = torch.tensor(out.output_logprobs)
    assert torch.max(torch.abs(got - ref_t)) < 1e-4
    assert torch.max(torch.abs(got - ref_1)) > 1e-2
    # every sampled token is inside the top-5 of its step (placeholder tokens are never drawn)
    drawable = logits.clone()
    drawable[:, served.engine.never_sample] = float("-inf")
    top5 = torch.topk(drawable, 5, dim=-1).indices
    assert all(t in row for t, row in zip(out.output_tokens, top5.tolist()))


def test_greedy_seed_and_top_k_one(served, prompt_ids):
    def gen(**extra):
        body = {"prompt": prompt_ids, "max_tokens": 8, "logprobs": 0, "ignore_eos": True,
                "return_tokens_as_token_ids": True, **extra}
        return post(served, "/v1/completions", body).json()["choices"][0]["token_ids"]

    greedy = gen(temperature=0.0)
    assert greedy == gen(temperature=0.0)
    assert gen(temperature=1.0, top_k=1, seed=5) == greedy
    assert gen(temperature=1.0, seed=11) == gen(temperature=1.0, seed=11)
    samples = {tuple(gen(temperature=1.5, seed=s)) for s in range(4)}
    assert len(samples) > 1


def test_vision_placeholders_are_never_sampled(served, prompt_ids):
    never = set(served.engine.never_sample.tolist())
    assert served.engine.image_token_id in never and len(never) >= 4
    body = {"prompt": prompt_ids, "max_tokens": 300, "temperature": 3.0, "ignore_eos": True, "seed": 0,
            "logprobs": 0}
    ids = post(served, "/v1/completions", body).json()["choices"][0]["token_ids"]
    assert len(ids) == 300 and not never & set(ids)


def test_stop_token_ids_end_the_output(served, prompt_ids):
    greedy = post(served, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 6, "temperature": 0,
                                              "ignore_eos": True, "logprobs": 0}).json()
    ids = greedy["choices"][0]["token_ids"]
    stop_id = ids[2]
    first = ids.index(stop_id)
    res = post(served, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 6, "temperature": 0,
                                           "stop_token_ids": [stop_id], "logprobs": 0}).json()["choices"][0]
    assert res["finish_reason"] == "stop" and res["stop_reason"] == stop_id
    assert res["token_ids"] == ids[: first + 1]


def test_concurrent_requests_do_not_interfere(served, prompt_ids):
    bodies = [{"prompt": prompt_ids[: 10 + i], "max_tokens": 6 + i, "temperature": 1.0, "seed": i,
               "logprobs": 0, "ignore_eos": True} for i in range(4)]
    alone = [post(served, "/v1/completions", b).json()["choices"][0] for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: post(served, "/v1/completions", b).json()["choices"][0], bodies))
    for a, b in zip(alone, together):
        assert a["token_ids"] == b["token_ids"]
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-5)


def test_concurrent_image_chats_do_not_interfere(served):
    bodies = [{"messages": image_messages(png_b64(screenshot(seed=i))), "max_tokens": 5, "seed": i,
               "temperature": 1.0, "logprobs": True, "ignore_eos": True} for i in range(3)]
    alone = [post(served, "/v1/chat/completions", b).json()["choices"][0]["token_ids"] for b in bodies]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda b: post(served, "/v1/chat/completions", b).json(), bodies))
    assert [t["choices"][0]["token_ids"] for t in together] == alone


def test_chat_with_image_matches_offline_processor_ids(served, tiny_dir):
    """The ids the server generates from equal the ids a client builds with the model's own processor
    (what the policy endpoint records for training), via the exact payload AReaL's vLLM backend sends."""
    b64 = png_b64(screenshot(seed=1))
    msgs = image_messages(b64)
    proc = AutoProcessor.from_pretrained(tiny_dir)
    tok_msgs = [{"role": "system", "content": "You operate a computer."},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click the OK button."}]}]
    text = proc.apply_chat_template(tok_msgs, add_generation_prompt=True, tokenize=False)
    import io
    pil = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    ids = proc(images=[pil], text=[text], return_tensors="pt")["input_ids"][0].tolist()

    vllm_msgs = [msgs[0], {"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}},
                                                        {"type": "text", "text": "Click the OK button."}]}]
    gconfig = GenerationHyperparameters(max_new_tokens=6, temperature=1.0)
    req = BACKEND.build_generation_request(
        ModelRequest(input_ids=ids, image_data=[b64], vision_msg_vllm=[vllm_msgs], gconfig=gconfig),
        with_lora=False, version=0)
    assert req.endpoint == "/v1/chat/completions"
    body = post(served, req.endpoint, req.payload).json()
    assert body["prompt_token_ids"] == ids
    parsed = BACKEND.parse_generation_response(body)
    assert len(parsed.output_tokens) == len(parsed.output_logprobs) >= 1
    assert body["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("path,body,fragment", [
    ("/v1/completions", {"prompt": "IMAGE", "max_tokens": 2}, "image tokens but no images"),
    ("/v1/completions", {"prompt": [1, 2, 10**7], "max_tokens": 2}, "out of range"),
    ("/v1/completions", {"prompt": [], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2], "n": 2}, "n=1"),
    ("/v1/completions", {"prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "could not be decoded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, "not fetched"),
    ("/v1/chat/completions", {"messages": []}, "non-empty"),
    ("/areal_update_weights", {"model_path": "/nonexistent/dir"}, "not a directory"),
    ("/areal_init_weights_update_group", {}, "weight_update_mode=disk"),
])
def test_bad_requests_get_clear_400s(served, path, body, fragment):
    if body.get("prompt") == "IMAGE":
        body = {**body, "prompt": [served.engine.image_token_id] * 4}
    resp = post(served, path, body)
    assert resp.status_code == 400, resp.text
    assert fragment in resp.json()["error"]["message"]
    assert post(served, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1}).status_code == 200


def test_invalid_json_is_a_400(served):
    resp = httpx.post(served.url + "/v1/completions", content=b"{not json", timeout=30,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400


def test_pause_aborts_in_flight_and_holds_new_requests(served, prompt_ids):
    long_completion = {"prompt": prompt_ids, "max_tokens": 3000, "temperature": 1.0, "ignore_eos": True,
                       "logprobs": 0}
    long_chat = {"messages": image_messages(png_b64(screenshot(seed=2))), "max_tokens": 3000,
                 "ignore_eos": True, "logprobs": True}
    with ThreadPoolExecutor(3) as pool:
        f1 = pool.submit(post, served, "/v1/completions", long_completion)
        f2 = pool.submit(post, served, "/v1/chat/completions", long_chat)
        deadline = time.monotonic() + 30
        while httpx.get(served.url + "/version").json()["running_requests"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)   # both are decoding by now
        assert post(served, "/areal_pause_generation", {}).json()["success"]
        r1, r2 = f1.result(60).json()["choices"][0], f2.result(60).json()
        assert r1["finish_reason"] == "abort" and 0 < len(r1["token_ids"]) < 3000
        parsed = BACKEND.parse_generation_response(f1.result().json())
        assert parsed.stop_reason == "abort" and parsed.output_tokens == r1["token_ids"]
        # chat aborts return no tokens: AReaL re-sends the whole chat request after an abort
        assert r2["choices"][0]["finish_reason"] == "abort" and r2["choices"][0]["token_ids"] == []
        assert BACKEND.parse_generation_response(r2).output_tokens == []

        held = pool.submit(post, served, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 2})
        time.sleep(1.0)
        assert not held.done()
        assert httpx.get(served.url + "/version").json()["paused"] is True
        assert post(served, "/areal_continue_generation", {}).json()["success"]
        assert held.result(60).json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_disk_weight_update_bumps_version_and_changes_outputs(served, tiny_dir, tmp_path, prompt_ids):
    score = {"prompt": prompt_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1, "echo": True}

    def prompt_lps():
        return BACKEND.parse_score_response(post(served, "/v1/completions", score).json(), len(prompt_ids) - 1)

    before = prompt_lps()
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    new_dir = tmp_path / "weight_update_v3"   # the path shape AReaL's disk update uses
    model.save_pretrained(new_dir)
    try:
        resp = post(served, "/areal_update_weights", {"model_path": str(new_dir)}).json()
        assert resp["success"] and resp["version"] == 3
        info = httpx.get(served.url + "/version").json()
        assert info["version"] == 3 and info["weights_path"] == str(new_dir)
        after = prompt_lps()
        assert max(abs(a - b) for a, b in zip(before, after)) > 1e-2
        body = post(served, "/v1/completions", {"prompt": prompt_ids, "max_tokens": 2}).json()
        assert body["version"] == 3
    finally:
        restored = post(served, "/areal_update_weights", {"model_path": str(tiny_dir), "version": 0}).json()
        assert restored["version"] == 0
    assert prompt_lps() == pytest.approx(before, abs=1e-6)


def test_update_aborts_in_flight_requests(served, prompt_ids):
    body = {"prompt": prompt_ids, "max_tokens": 3000, "ignore_eos": True, "logprobs": 0}
    done = {}

    def run():
        done["r"] = post(served, "/v1/completions", body).json()["choices"][0]

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while httpx.get(served.url + "/version").json()["running_requests"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    assert post(served, "/areal_update_weights",
                {"model_path": str(served.engine.model_dir), "version": 0}).json()["success"]
    t.join(60)
    assert done["r"]["finish_reason"] == "abort"
