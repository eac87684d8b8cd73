"""Benchmark of a fleet of gym hosts: episodes per hour and placement balance with 1, 2 and 3 hosts; prints one
JSON object (``--out`` also writes it).

Each host is a ``cua-gym serve`` subprocess with real desktops (``--max-executions`` each). The work is what the
training workflow asks of a gym, placed the way it places it (cua_rl/genv/fleet.py, cua_rl/workflow/placement.py):
groups of ``--group`` episodes, two groups in flight per host (so every configuration fills its hosts alike),
each episode a scripted one-turn play of the key-colour task 053 (create a seeded execution, screenshot, one key,
screenshot, evaluate, terminate). No model and no agent: the bench measures what the gyms deliver.

On one machine the hosts share its cores, so N hosts here are not N machines. The JSON reports, per
configuration, the episodes per hour of the whole fleet, each host's share of the episodes (balance: the
largest share over the smallest; 1.0 is even) and its episode time, the CPU the gyms and their desktops used per
episode, and the arithmetic for N machines: a host on a machine of its own delivers about what one host
delivers alone here, cores permitting (``per_host_alone x N``, bounded by what the trainer consumes). The
machine's load average before and after is in the JSON: other jobs share the cores.

  python bench/fleet_bench.py                       # 1, 2, 3 hosts, 40 s each (~3 minutes on 2 cores)
  python bench/fleet_bench.py --hosts 1,2,3 --seconds 60 --max-executions 4 --out docs/bench/fleet_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gym_bench import tree_cpu_s  # noqa: E402  (CPU of a process tree, from /proc)
from cua_rl.genv import GenvClient  # noqa: E402
from cua_rl.genv.fleet import Fleet  # noqa: E402
from cua_rl.http.serve import free_port  # noqa: E402

TASK = "053"   # the key-colour curriculum task: a seeded board, one key decides


def start_gyms(n: int, max_executions: int, logs: Path) -> list[tuple[subprocess.Popen, str]]:
    gyms = []
    for i in range(n):
        port = free_port()
        log = open(logs / f"gym-{n}-{i}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "cua_rl.local_gym", "serve", "--port", str(port),
                                 "--max-executions", str(max_executions), "--display-base", str(400 + 60 * i),
                                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        gyms.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in gyms:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gym {url} did not start")
            time.sleep(0.3)
    return gyms


async def episode(url: str, seed: int, placement) -> float:
    started = time.monotonic()
    async with GenvClient(url, "desktop") as gym, \
            placement.execution(gym, TASK, {"seed": seed}, busy_wait_s=120) as ex:
        await gym.screenshot(ex.execution_id)
        await gym.act(ex.execution_id, {"type": "key", "keys": ["r"]})
        await gym.screenshot(ex.execution_id)
        await gym.evaluate(ex.execution_id)
    return time.monotonic() - started


async def run_fleet(urls: list[str], seconds: float, group: int, in_flight: int) -> dict:
    from cua_rl.workflow.placement import play_group

    fleet = Fleet(urls, "desktop", interval_s=1.0)
    done: dict[str, list[float]] = collections.defaultdict(list)
    stop_at = time.monotonic() + seconds
    seeds = iter(range(1, 10**6))

    async def worker() -> None:
        while time.monotonic() < stop_at:
            seed = next(seeds)
            results, host = await play_group(fleet, "", group, lambda url, _i, p: episode(url, seed, p))
            for r in results:
                if isinstance(r, float):
                    done[host].append(r)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.monotonic() - started
    await fleet.aclose()
    return {"elapsed_s": round(elapsed, 1), "done": {u: done.get(u, []) for u in urls}}


def measure(n: int, args, logs: Path) -> dict:
    gyms = start_gyms(n, args.max_executions, logs)
    try:
        cpu0 = sum(tree_cpu_s(p.pid) for p, _ in gyms)
        out = asyncio.run(run_fleet([u for _, u in gyms], args.seconds, args.group, 2 * n))
        cpu = sum(tree_cpu_s(p.pid) for p, _ in gyms) - cpu0
    finally:
        for proc, _ in gyms:
            proc.terminate()
        for proc, _ in gyms:
            proc.wait(60)
    counts = {u: len(v) for u, v in out["done"].items()}
    total = sum(counts.values())
    shares = [c / total for c in counts.values()] if total else []
    return {
        "hosts": n, "max_executions_per_host": args.max_executions, "groups_in_flight": 2 * n,
        "episodes": total, "seconds": out["elapsed_s"],
        "episodes_per_hour": round(total * 3600 / out["elapsed_s"]),
        "per_host": {u: {"episodes": counts[u], "share": round(counts[u] / total, 3) if total else None,
                         "mean_episode_s": round(sum(v) / len(v), 2) if v else None}
                     for u, v in out["done"].items()},
        "balance_max_over_min_share": round(max(shares) / min(shares), 3) if shares and min(shares) else None,
        "gym_cpu_s_per_episode": round(cpu / total, 3) if total else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,2,3", help="fleet sizes to measure, e.g. 1,2,3")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long each fleet size plays")
    ap.add_argument("--max-executions", type=int, default=4, help="each host's capacity (--max-executions)")
    ap.add_argument("--group", type=int, default=2, help="episodes per group (gconfig.n_samples)")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args(argv)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"fleet-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results = [measure(int(n), args, logs) for n in args.hosts.split(",")]
    alone = results[0]["episodes_per_hour"] if results and results[0]["hosts"] == 1 else None
    report = {
        "bench": "fleet_bench", "task": TASK, "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "fleets": results,
        "arithmetic": None if alone is None else {
            "per_host_alone_episodes_per_hour": alone,
            "n_hosts_on_machines_of_their_own": {str(n): alone * n for n in (1, 2, 3, 8)},
            # the CPU bound of one host: its cores over the gym's CPU per episode (desktops included)
            "cpu_bound_episodes_per_hour_per_core": round(3600 / results[0]["gym_cpu_s_per_episode"])
            if results[0]["gym_cpu_s_per_episode"] else None,
            "why": "on one machine the hosts share its cores; each on a machine of its own delivers about what one "
                   "host delivers alone here (its cores permitting), so N hosts deliver about N times that, "
                   "placement keeping each host's share even (balance near 1), up to what the trainer consumes",
        },
        "logs": str(logs),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
