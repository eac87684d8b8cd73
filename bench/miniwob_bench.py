"""Benchmark of the MiniWoB++ gym (browser desktops) on this machine; prints one JSON object.

Over real HTTP against a ``cua-gym serve --gym-id miniwob`` subprocess (Chromium on Xvfb in the sandbox):
  - create-execution latency: cold (a browser start), warm with the task's page already loaded in the spare
    (a seeded reset), and warm from a spare showing another task's page (a page load, then the reset);
  - step latency (action + PNG screenshot) p50/p90/p99 at 4, 8 and 16 concurrent browser desktops, each
    stepping about once per second with a random phase (an agent waits for its model between steps);
  - memory per browser desktop (PSS of every process of the desktops: Xvfb, openbox, bwrap, Chromium's);
  - CPU milliseconds per step of the gym and its desktops (from /proc), and the cores they used.

  python bench/miniwob_bench.py                       # ~3 minutes on 2 cores
  python bench/miniwob_bench.py --levels 4,8,16,24 --duration 20

With ``--against-reference``, the ``miniwob`` package's own Gymnasium environment and this gym play the same
recorded episodes side by side (bench/miniwob_reference.py says how): reset and step p50/p90, episodes per
hour at 1, 4 and 16 concurrent, CPU per step, the same reward for the same actions, and ``speedup``.

  python bench/miniwob_bench.py --against-reference               # ~6 minutes on 2 cores
  python bench/miniwob_bench.py --against-reference --levels 1,4 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import httpx
from gym_bench import Gym, step_load, summary

TASK, OTHER = "enter-text", "click-button"
FIELD = {"type": "click", "x": 0.5, "y": 0.336}   # enter-text's text field on the 480x630 screen, seed 1
TARGETS = {"create_warm_p50_ms": 150, "create_cold_p50_ms": 3000, "step_p50_ms_at_16": 100,
           "step_p90_ms_at_16": 300}


class MiniwobGym(Gym):
    def __init__(self, *extra: str) -> None:
        super().__init__("--gym-id", "miniwob", *extra)
        self.api = f"{self.base}/api/v1/miniwob"


def pss_kib(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


def tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found - {root}


async def create(http, gym: Gym, task: str, seed: int) -> tuple[str, float, bool]:
    t = time.perf_counter()
    r = await http.post(f"{gym.api}/tasks/{task}", json={"options": {"seed": seed}})
    ms = (time.perf_counter() - t) * 1e3
    r.raise_for_status()
    return r.json()["execution_id"], ms, r.json().get("warm", False)


async def bench_creates(args) -> dict:
    out: dict = {}
    gym = MiniwobGym("--pool-size", "1", "--max-spares", "1", "--prewarm", TASK)
    try:
        async with httpx.AsyncClient(timeout=120) as http:
            same, other = [], []
            for i in range(args.creates):
                await gym.wait(http, spares=1)
                eid, ms, warm = await create(http, gym, TASK, i)
                assert warm, "expected a warm browser"
                same.append(ms)
                await http.post(f"{gym.api}/executions/{eid}/terminate", json={})
            for i in range(args.creates):       # alternate pages: each spare shows the other one
                await gym.wait(http, spares=1)
                eid, ms, warm = await create(http, gym, OTHER if i % 2 == 0 else TASK, i)
                assert warm
                other.append(ms)
                await http.post(f"{gym.api}/executions/{eid}/terminate", json={})
            out["create_warm_ms"] = summary(same)
            out["create_warm_ms_note"] = "spare shows the task's page: seeded reset in the loaded page"
            out["create_warm_other_page_ms"] = summary(other)
            out["create_warm_other_page_ms_note"] = "spare shows another task: page load, then the reset"
    finally:
        gym.stop()
    return out


async def bench_cold_and_steps(args) -> dict:
    out: dict = {}
    gym = MiniwobGym("--pool-size", "0", "--max-executions", str(max(args.levels) + 2))
    try:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=200)) as http:
            await gym.wait(http)
            lat = []
            for i in range(max(3, args.creates // 2)):
                eid, ms, _ = await create(http, gym, TASK, i)
                lat.append(ms)
                await http.post(f"{gym.api}/executions/{eid}/terminate", json={})
            out["create_cold_ms"] = summary(lat)
            out["steps_png"] = {}
            for level in args.levels:
                out["steps_png"][str(level)] = await bench_level(http, gym, level, args)
    finally:
        gym.stop()
    return out


async def bench_level(http, gym: Gym, level: int, args) -> dict:
    sem = asyncio.Semaphore(4)

    async def make() -> str:
        async with sem:
            eid = (await create(http, gym, TASK, 1))[0]    # one layout: FIELD is where the text field is
            (await http.post(f"{gym.api}/executions/{eid}/actions", json={"action": FIELD})).raise_for_status()
            return eid
    mem0 = _mem_available_kib()
    t_ready = time.monotonic()
    eids = await asyncio.gather(*(make() for _ in range(level)))
    ready_s = time.monotonic() - t_ready
    await asyncio.sleep(1.0)  # let fresh browsers go idle
    desk_pss = pss_kib(tree(gym.proc.pid))
    mem_drop = mem0 - _mem_available_kib()
    res = await step_load(http, gym, eids, "png", args, settle_s=0.0)
    await asyncio.gather(*(http.post(f"{gym.api}/executions/{e}/terminate", json={}) for e in eids))
    return {**res, "all_ready_s": round(ready_s, 1),
            "pss_mib_per_browser_desktop": round(desk_pss / 1024 / level, 1),
            "mem_available_drop_mib_per_desktop": round(mem_drop / 1024 / level, 1)}


def _mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default=None, help="concurrent browser desktops to step (default 4,8,16; "
                   "with --against-reference 1,4,16)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of stepping per level (default 8; with --against-reference 20 per side)")
    p.add_argument("--against-reference", action="store_true",
                   help="side by side with the miniwob package's own environment (bench/miniwob_reference.py)")
    p.add_argument("--seeds", type=int, default=3, help="--against-reference: seeds per task")
    p.add_argument("--sides", default="reference,ours,ours_reload,ours_new_browser",
                   help="--against-reference: which sides to time (ours: the gym's default; ours_reload: "
                        "--no-restart-in-page; ours_new_browser: --new-browser-per-episode)")
    p.add_argument("--period", type=float, default=1.0, help="seconds between steps of one execution")
    p.add_argument("--creates", type=int, default=8, help="warm create samples (cold: half as many)")
    args = p.parse_args()
    reference = args.against_reference
    args.levels = [int(x) for x in (args.levels or ("1,4,16" if reference else "4,8,16")).split(",") if x]
    args.duration = args.duration or (20.0 if reference else 8.0)
    if reference:
        import miniwob_reference

        args.ref_levels, args.sides = args.levels, [s for s in args.sides.split(",") if s]
        # its own event loops and worker processes: off this loop
        print(json.dumps(await asyncio.to_thread(miniwob_reference.main, args), indent=2))
        return
    t = time.monotonic()
    result = {"bench": "miniwob_gym", "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]},
              "task": TASK, "screen": "480x630 (zoom 3)"}
    result.update(await bench_creates(args))
    result.update(await bench_cold_and_steps(args))
    s16 = result["steps_png"].get("16", {})
    result["targets"] = TARGETS
    result["meets_targets"] = {
        "create_warm_p50": result["create_warm_ms"]["p50"] <= TARGETS["create_warm_p50_ms"],
        "create_cold_p50": result["create_cold_ms"]["p50"] <= TARGETS["create_cold_p50_ms"],
        "step_p50_at_16": s16.get("p50") is not None and s16["p50"] <= TARGETS["step_p50_ms_at_16"],
        "step_p90_at_16": s16.get("p90") is not None and s16["p90"] <= TARGETS["step_p90_ms_at_16"],
    }
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    result["wall_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
