"""Benchmark of the CPU model server on a screenshot prompt; prints one JSON object.

Measures, against a real `cua-model serve` child process (the way training runs it):
  - prompt: image tokens and prompt tokens a 1280x800 screenshot turn costs;
  - ttft: time to first token of a screenshot chat request (client-side wall time of a max_tokens=1
    request, and the server's own admission->first-token time), median over --repeats;
  - decode tokens/s of one stream (ignore_eos, --max-tokens tokens), median over --repeats;
  - aggregate tokens/s with --concurrency simultaneous screenshot requests.

Usage: python bench/model_bench.py [--model-dir DIR] [--threads 1] [--max-tokens 64] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from PIL import Image, ImageDraw

from cua_rl.local_model import ModelServerProcess, build_tiny


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


def timed(url: str, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=None, help="default: build the tiny model in a temp dir")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = args.model_dir or str(build_tiny(os.path.join(tmp, "tiny")))
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with ModelServerProcess(model_dir, threads=args.threads) as srv:
            start_s = time.perf_counter() - t0
            timed(srv.url, chat_body(99, 2))    # warm-up (first-call allocations)
            ttft_client, ttft_server = [], []
            for i in range(args.repeats):
                wall, body = timed(srv.url, chat_body(i, 1))
                ttft_client.append(wall)
                ttft_server.append(body["metrics"]["ttft_s"])
            usage = body["usage"]
            decode = []
            for i in range(args.repeats):
                wall, body = timed(srv.url, chat_body(i, args.max_tokens))
                m = body["metrics"]
                n = body["usage"]["completion_tokens"]
                decode.append((n - 1) / (m["total_s"] - m["ttft_s"]))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(lambda i: timed(srv.url, chat_body(i, args.max_tokens)),
                                        range(args.concurrency)))
            conc_wall = time.perf_counter() - t0
            conc_tokens = sum(b["usage"]["completion_tokens"] for _, b in results)

    prompt_tokens = usage["prompt_tokens"]
    print(json.dumps({
        "bench": "model_bench", "model": "tiny-qwen3-vl" if args.model_dir is None else model_dir,
        "torch_threads": args.threads, "cpu_count": os.cpu_count(),
        "build_tiny_s": round(build_s, 2), "server_start_s": round(start_s, 2),
        "screenshot": "1280x800 PNG", "prompt_tokens": prompt_tokens,
        "ttft_s_median_client": round(statistics.median(ttft_client), 4),
        "ttft_s_median_server": round(statistics.median(ttft_server), 4),
        "decode_tokens_per_s_single_stream": round(statistics.median(decode), 1),
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "aggregate_tokens_per_s": round(conc_tokens / conc_wall, 1),
        "aggregate_wall_s": round(conc_wall, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
