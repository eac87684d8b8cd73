"""Benchmark of forking live executions (``POST .../executions/{id}/fork``, docs/local_gym.md "Forks"); prints one
JSON object.

For each backend, depth (the actions the parent played before the fork: what a replay plays again) and count
(children per fork), through the HTTP API with ``GenvClient`` against a gym served in this process:
  - ``fork_ms``: the fork's reply;
  - ``first_screenshots_ms``: from sending the fork to having every child's first screenshot (PNG, asked for
    concurrently once the reply came): what a workflow waits before its continuations can start;
    ``per_child_ms`` is that divided by the count;
  - ``refused``: forks answered 409 (a child did not reach the parent's state), left out of the timings;
  - ``child_pss_mib``: the proportional set size of each child's processes (the desktop's X server, window manager,
    apps or browser; a VM's QEMU), read from /proc/PID/smaps_rollup after the fork.
Backends: ``desktop`` (the curriculum's key-sequence board, task 054: a key per action; past the third key the
board shows its black "lost" screen, still one state), ``miniwob`` (click-checkboxes: a click per action, on its
first three boxes in turn), ``vm`` (the test guest, task 901, by snapshot: the depth is one typed command and
does not change what a fork does). Replay forks run with warm spares: before each fork the bench waits until the
pool holds ``count`` spares (``pool_size`` is the largest count), as a gym sized for its forks would.

  python bench/fork_bench.py                       # ~6 minutes on 2 cores
  python bench/fork_bench.py --backends desktop --reps 5 --depths 0,3,10 --counts 1,2,4,8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))   # this clone's cua_rl, whatever is installed

from gym_bench import summary  # noqa: E402 - p50/p90/p99 and n
from miniwob_bench import pss_kib, tree  # noqa: E402 - a process tree's PSS

from cua_rl.genv import GenvClient, GenvError  # noqa: E402
from cua_rl.local_gym import curriculum, start_gym_server  # noqa: E402

TASKS = {"desktop": "054", "miniwob": "click-checkboxes", "vm": "901"}
SEED = 7
VM_TASKS = Path(__file__).resolve().parents[1] / "examples" / "vm_tasks"


def actions(backend: str, depth: int) -> list[dict]:
    if backend == "desktop":
        keys = list(curriculum.make_instance("key-sequence", SEED).solution)
        return (keys + [{"type": "key", "keys": ["r"]}] * depth)[:depth]
    if backend == "miniwob":
        return [{"type": "click", "x": 0.1, "y": (0.33, 0.40, 0.47)[i % 3]} for i in range(depth)]
    return [{"type": "type", "text": "echo one > /root/a.txt\n"}][:depth]


def pss_mib(pids: list[int]) -> float:
    """Proportional set size of ``pids`` and everything below them, in MiB."""
    return pss_kib(set(pids).union(*(tree(pid) for pid in pids))) / 1024


def child_pids(desk) -> list[int]:
    machine = getattr(desk, "machine", None)
    return [machine.proc.pid] if machine is not None else desk.pids()


async def wait_spares(gym, n: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while gym.manager.pool_stats()["spares"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not reach {n} spares within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def one_fork(c: GenvClient, gym, backend: str, depth: int, count: int) -> dict:
    parent = (await c.create_execution(TASKS[backend], {"seed": SEED})).execution_id
    try:
        for action in actions(backend, depth):
            assert (await c.act(parent, action))["ok"]
        await c.screenshot(parent)                     # the agent saw the screen it forks from
        if backend != "vm":
            await wait_spares(gym, count)
        t0 = time.monotonic()
        try:
            fork = await c.fork(parent, count)
        except GenvError as exc:
            if exc.status_code != 409:
                raise
            return {"refused": str(exc)}                # a child did not reach the parent's state: counted
        fork_s = time.monotonic() - t0
        kids = [e.execution_id for e in fork.executions]
        try:
            await asyncio.gather(*(c.screenshot(k) for k in kids))
            first_s = time.monotonic() - t0
            pss = [pss_mib(child_pids(gym.manager.executions[k].desktop)) for k in kids]
        finally:
            await asyncio.gather(*(c.terminate(k) for k in kids))
        return {"fork_ms": fork_s * 1e3, "first_screenshots_ms": first_s * 1e3, "pss": pss}
    finally:
        await c.terminate(parent)


async def bench_backend(backend: str, depths: list[int], counts: list[int], reps: int) -> dict:
    big = max(counts)
    opts = {"desktop": dict(pool_size=big, max_spares=big, prewarm=[TASKS["desktop"]]),
            "miniwob": dict(gym_id="miniwob", pool_size=big, max_spares=big, prewarm=[TASKS["miniwob"]]),
            "vm": dict(tasks_dir=str(VM_TASKS), pool_size=0, x_spares=0)}[backend]
    if backend == "vm":
        from cua_rl.local_gym.vm import guest_image

        os.environ.setdefault(guest_image.ENV, str(guest_image.ensure()))
    out: dict = {"task": TASKS[backend], "cells": []}
    with start_gym_server(port=0, max_executions=big + 2, **opts) as gym:
        async with GenvClient(gym.url, gym.gym_id) as c:
            if backend == "vm":   # the template's boot, once per gym: not part of any fork
                t0 = time.monotonic()
                await c.terminate((await c.create_execution(TASKS["vm"])).execution_id)
                out["template_boot_ms"] = round((time.monotonic() - t0) * 1e3)
            for depth in depths:
                for count in counts:
                    runs = [await one_fork(c, gym, backend, depth, count) for _ in range(reps)]
                    refused = [r["refused"] for r in runs if "refused" in r]
                    runs = [r for r in runs if "refused" not in r]
                    first = [r["first_screenshots_ms"] for r in runs]
                    out["cells"].append({
                        "depth": depth, "count": count, "refused": len(refused), "refusals": refused[:3],
                        "fork_ms": summary([r["fork_ms"] for r in runs]),
                        "first_screenshots_ms": summary(first),
                        "per_child_ms": summary([f / count for f in first]),
                        "child_pss_mib": summary([p for r in runs for p in r["pss"]])})
                    print(f"{backend} depth {depth} count {count}: first screenshots p50 "
                          f"{out['cells'][-1]['first_screenshots_ms']['p50']:.0f} ms", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="desktop,miniwob,vm")
    ap.add_argument("--depths", default="0,3,6", help="actions played before the fork (the desktop backend)")
    ap.add_argument("--miniwob-depths", default="0,3", help="the same for the miniwob backend (its spares cost more)")
    ap.add_argument("--counts", default="1,2,4", help="children per fork (the vm backend: those up to 2)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    depths = {"desktop": [int(d) for d in args.depths.split(",")],
              "miniwob": [int(d) for d in args.miniwob_depths.split(",")], "vm": [1]}
    counts = [int(n) for n in args.counts.split(",")]
    result: dict = {"bench": "fork", "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
                    "reps": args.reps, "backends": {}}
    t0 = time.monotonic()
    for backend in args.backends.split(","):
        result["backends"][backend] = asyncio.run(bench_backend(
            backend, depths[backend], [n for n in counts if backend != "vm" or n <= 2], args.reps))
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["wall_s"] = round(time.monotonic() - t0)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
