"""AReaL's vLLM server on the CPU serving the tiny model: a disk weight update through AReaL's own route
(``/areal_update_weights`` -> the worker extension -> vLLM's loader) changes what vLLM computes to the new
checkpoint's values, and loading the original back restores them (cua_rl/local_model/vllm_cpu.py)."""

from __future__ import annotations

import httpx
import torch
from transformers import AutoModelForImageTextToText

from cua_rl.local_model import build_tiny

PROMPT = list(range(300, 340))


def _served(url: str) -> tuple[list[int], list[float]]:
    body = httpx.post(url + "/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "logprobs": 0, "return_tokens_as_token_ids": True,
        "seed": 3}, timeout=300).json()
    lp = body["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]


def _hf(model_dir, tokens: list[int]) -> list[float]:
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([PROMPT + tokens])).logits[0].log_softmax(-1)
    return [logp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(tokens)]


def _max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def test_disk_weight_update_reaches_the_running_vllm(vllm_server, tiny_model_dir, tmp_path):
    other = build_tiny(tmp_path / "other", seed=7)  # same shapes and tokenizer, other weights
    toks, lps = _served(vllm_server.url)
    assert _max_diff(lps, _hf(tiny_model_dir, toks)) < 1e-4
    try:
        r = httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": str(other)}, timeout=300)
        assert r.status_code == 200 and r.json()["success"], r.text
        toks2, lps2 = _served(vllm_server.url)
        new, old = _max_diff(lps2, _hf(other, toks2)), _max_diff(lps2, _hf(tiny_model_dir, toks2))
        print(f"GATE vLLM after the update: |diff| to the new weights {new:.1e}, to the old ones {old:.1e}")
        assert new < 1e-4 and old > 1e-2
    finally:
        r = httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": tiny_model_dir}, timeout=300)
        assert r.status_code == 200, r.text
    toks3, lps3 = _served(vllm_server.url)
    assert _max_diff(lps3, _hf(tiny_model_dir, toks3)) < 1e-4
