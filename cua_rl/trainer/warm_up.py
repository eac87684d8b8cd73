"""One screenshot-sized image request to each inference server at start-up, before the first step needs it.

Why: a server's first multimodal request can pay one-off costs the start-up did not: on the CPU with
TorchDynamo on, vLLM compiles its sampler on the first request (20.3 s for the tiny Qwen3-VL with cold
caches, then 0.07 s; measured in session 13), and any engine loads and runs its image path for the first
time. Paid in the first step, that time stalls every episode of the step behind one model call, and a step
limit or the agent's turn timeout can turn it into dropped episodes. The CPU recipe now runs vLLM with
TorchDynamo off (``vllm_server.CPU_ENV``: the first image request takes ~0.1 s), so here it is a guard for every
other set-up (a GPU engine, SGLang, another vLLM version); the trainer logs how long each server took.

The request is the engine's own image path (``/v1/chat/completions`` with a data-URL PNG, how AReaL's vLLM and
SGLang clients send images), one output token. A failure is logged, never fatal: the first episode then pays it.
"""

from __future__ import annotations

import base64
import io
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from cua_rl.http.retry import error_detail

logger = logging.getLogger(__name__)

WARM_UP_TIMEOUT_S = 900.0      # a GPU engine's first vision-encoder run can compile for minutes


def _screen_png(width: int, height: int) -> str:
    """A PNG of a plain desktop-like screen (grey with a darker bar), base64; a flat image is enough to run the
    whole image path, and a screen's size gives the same number of image tokens as a screenshot."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), (200, 200, 205))
    ImageDraw.Draw(img).rectangle((0, height - 40, width, height), fill=(40, 40, 60))
    out = io.BytesIO()
    img.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def warm_up_one(addr: str, image_b64: str, timeout_s: float = WARM_UP_TIMEOUT_S) -> float | None:
    """Seconds ``host:port`` took to answer one image request, or None (logged) when it did not answer."""
    body = {"max_tokens": 1, "temperature": 0.0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image_b64}"}},
        {"type": "text", "text": "Describe the screen."}]}]}
    started = time.monotonic()
    try:
        response = httpx.post(f"http://{addr}/v1/chat/completions", json=body, timeout=timeout_s)
        if response.status_code >= 400:
            raise ValueError(error_detail(response))
        usage = response.json().get("usage") or {}
    except (httpx.HTTPError, ValueError) as exc:
        logger.warning("image warm-up of the model server %s failed (the first episode pays its first image "
                       "request instead): %s: %s", addr, type(exc).__name__, exc)
        return None
    seconds = time.monotonic() - started
    logger.info("model server %s answered its first image request in %.2f s at start-up (%s prompt tokens)", addr,
                seconds, usage.get("prompt_tokens", "?"))
    return seconds


def warm_up(addrs: list[str], width: int = 1280, height: int = 800,
            timeout_s: float = WARM_UP_TIMEOUT_S) -> dict[str, float | None]:
    """One image request to every server at once: ``{addr: seconds or None}``."""
    if not addrs:
        return {}
    image = _screen_png(width, height)
    with ThreadPoolExecutor(max_workers=min(8, len(addrs))) as pool:
        return dict(zip(addrs, pool.map(lambda a: warm_up_one(a, image, timeout_s), addrs)))
