"""The policy endpoint's own cost per turn, generation taken out; prints one JSON object.

    python -m bench.endpoint_bench [--calls 6] [--levels 1,8,32] [--max-pixels 1024000]
    python -m bench.endpoint_bench --compare /path/to/an/older/checkout    # before/after in one run

(from the repository root, as a module: the engine double imports as ``tests.doubles``).

What a turn costs the endpoint before and after the engine: parsing, decoding the screenshots, shrinking them
to ``max_pixels``, the processor, templating and the reply. Episodes run like an agent's: each turn sends a
new 1280x800 screenshot plus up to ``history - 1`` earlier ones (``max_screenshots_in_history``), at 1, 8 and
32 episodes at once against one endpoint (one rollout worker). The engine is ``EngineDouble`` from
tests/doubles/policy_helpers.py, the documented stand-in for AReaL's engine that answers at once: with real
generation in the loop the endpoint's CPU share could not be told apart from vLLM's on the same cores
(bench/policy_bench.py measures the endpoint in front of real vLLM). Figures per level and history:
``calls_per_s`` (all episodes together), ``ms_per_call_median``/``p90`` (round trip, as an agent sees it).

``--compare DIR`` runs this file's measurement on DIR's code (its ``examples/cua_agent``) in a subprocess
first, then on this checkout's, and adds ``ratio`` (after/before) for every figure. The subprocess imports
DIR's ``cua_rl`` because its ``PYTHONPATH`` starts with DIR (and DIR/examples/cua_agent, where the package
lived before it moved); the measurement refuses to run on any other checkout's code than ``--repo``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(repo: Path, calls: int, levels: list[int], max_pixels: int) -> dict:
    import cua_rl

    if not Path(cua_rl.__file__).resolve().is_relative_to(repo.resolve()):
        raise SystemExit(f"cua_rl is imported from {Path(cua_rl.__file__).parent}, not from --repo {repo} "
                         "(--compare runs an older checkout with its own PYTHONPATH)")
    import httpx
    from areal.api.cli_args import GenerationHyperparameters
    from transformers import AutoProcessor

    from bench.policy_bench import screenshot_url
    from cua_rl.local_model import build_tiny
    from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers
    from tests.doubles.policy_helpers import EngineDouble

    async def run(processor) -> dict:
        endpoint = PolicyEndpoint(EngineDouble(processor.tokenizer), processor, processor.tokenizer,
                                  GenerationHyperparameters(max_new_tokens=16, max_tokens=65536),
                                  EndpointSettings(max_screenshots_in_history=3, max_pixels=max_pixels))
        screens = [screenshot_url(seed) for seed in range(calls + 40)]  # encoded once, outside the timing

        async def episode(http, e: int, history: int, times: list[float]) -> None:
            ep = await endpoint.open_episode()
            msgs = [{"role": "system", "content": "You operate a computer."}]
            for turn in range(calls):
                keep = [screens[(e + t) % len(screens)] for t in range(max(0, turn - history + 1), turn + 1)]
                body = {"messages": msgs + [{"role": "user", "content": [
                    {"type": "text", "text": f"turn {turn}"}] + [
                    {"type": "image_url", "image_url": {"url": u}} for u in keep]}]}
                t0 = time.perf_counter()
                r = await http.post(ep.base_url + "/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {ep.key}"})
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            endpoint.close_episode(ep)

        out = {}
        try:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                await episode(http, 0, 3, [])  # warm-up: processor caches, thread pool
                for level in levels:
                    for history in (1, 3):
                        times: list[float] = []
                        t0 = time.perf_counter()
                        await asyncio.gather(*(episode(http, e, history, times) for e in range(level)))
                        wall = time.perf_counter() - t0
                        ms = sorted(1000 * t for t in times)
                        out[f"{level}_episodes_{history}_screenshots"] = {
                            "calls": len(times), "calls_per_s": round(len(times) / wall, 2),
                            "ms_per_call_median": round(statistics.median(ms), 1),
                            "ms_per_call_p90": round(ms[int(0.9 * (len(ms) - 1))], 1)}
        finally:
            await endpoint.aclose()
            await close_loop_servers()
        return out

    with tempfile.TemporaryDirectory() as tmp:
        processor = AutoProcessor.from_pretrained(str(build_tiny(Path(tmp) / "tiny")))
        figures = asyncio.run(run(processor))
    for level in levels:  # the measure: a 3-screenshot turn against a 1-screenshot one
        one, three = figures[f"{level}_episodes_1_screenshots"], figures[f"{level}_episodes_3_screenshots"]
        figures[f"{level}_episodes_3_vs_1_screenshot_cost"] = round(three["ms_per_call_median"]
                                                                     / one["ms_per_call_median"], 2)
    return {"code": str(repo), "cpus": len(os.sched_getaffinity(0)), "calls_per_episode": calls,
            "max_pixels": max_pixels, "figures": figures}


def ratios(before: dict, after: dict) -> dict:
    out = {}
    for key, a in after.items():
        b = before.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out[key] = {k: round(a[k] / b[k], 3) for k in a if k != "calls" and b.get(k)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=6, help="turns per episode")
    ap.add_argument("--levels", default="1,8,32", help="episodes at once")
    ap.add_argument("--max-pixels", type=int, default=1024000, help="config.yaml's policy.max_pixels")
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose code is measured (must be the cua_rl "
                    "imported; --compare sets it for the older checkout)")
    ap.add_argument("--compare", default="", help="an older checkout: measure it first, then this one")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    # AReaL and transformers log to stdout; keep stdout for the JSON alone.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if args.compare:
        cmd = [sys.executable, __file__, "--repo", args.compare, "--calls", str(args.calls),
               "--levels", args.levels, "--max-pixels", str(args.max_pixels)]
        # The older checkout's package first (today's layout, then the one before the move), this checkout's
        # bench and tests.doubles after it.
        older = Path(args.compare)
        path = [str(older), str(older / "examples" / "cua_agent"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        before = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
        after = measure(Path(args.repo), args.calls, levels, args.max_pixels)
        result = {"before": before, "after": after, "ratio_after_over_before": ratios(before["figures"],
                                                                                      after["figures"])}
    else:
        result = measure(Path(args.repo), args.calls, levels, args.max_pixels)
    print(json.dumps(result, indent=2), file=json_out)
    json_out.flush()


if __name__ == "__main__":
    main()
