"""Agent-service overhead per step, excluding model and gym time. Prints JSON.

Set-up (all on loopback): the agent service as its own process (``python -m cua_rl.local_agent serve``),
the real embedded gym (Xvfb desktops) and the scripted model server from the tests (an instant test
double, tests/doubles/model_double.py) in this process. Each run is scripted as ``--steps - 1``
mouse moves (the gym's cheapest real action) and an answer.

Two figures per concurrency level:
- ``overhead_ms``: the agent's own wall time per step, i.e. step time minus the time spent awaiting the
  gym (screenshot, actions) and the model (one chat completion), as the agent measures it
  (``steps[].timing.overheadMs``). Building the request body is inside it; httpx's JSON encoding of the
  body is inside the model time.
- ``agent_cpu_ms_per_step``: CPU time (user+system) of the agent process over the whole measurement,
  divided by the steps run: everything the service spends, serialisation and HTTP serving included.

Usage (from the repository root, as a module: the test double imports as ``tests.doubles``):
    python -m bench.agent_bench [--runs 4] [--steps 20] [--concurrency 1,8,32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cua_rl.genv import GenvClient
from cua_rl.http.retry import RetryPolicy, send_with_retry
from cua_rl.http.serve import serve_app_in_thread
from cua_rl.local_gym import load_tasks, start_gym_server
from tests.doubles.model_double import ScriptedModel, build_model_app, qwen_call  # the scripted model double

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"mean": round(statistics.fmean(ordered), 3), "p50": round(pick(0.5), 3),
            "p90": round(pick(0.9), 3), "max": round(ordered[-1], 3)}


def script(steps: int, i: int) -> list[str]:
    moves = [qwen_call(action="mouse_move", coordinate=[100 + (10 * k + i) % 800, 100 + (7 * k) % 800])
             for k in range(steps - 1)]
    return moves + [qwen_call(action="answer", text=f"run-{i}")]


async def measure(agent_url: str, agent_pid: int, gym, model: ScriptedModel, model_url: str, task_id: str,
                  concurrency: int, runs: int, steps: int, level: int) -> dict:
    total_runs = max(runs, concurrency)
    async with GenvClient(gym.url, gym.gym_id) as g, httpx.AsyncClient(base_url=agent_url, timeout=60) as http:
        executions = [(await g.create_execution(task_id)).execution_id for _ in range(min(concurrency, 4))]
        try:
            payloads = []
            for i in range(total_runs):
                key = model.script(f"c{level}-{i}", script(steps, i))
                payloads.append({"task": "move the mouse around", "agent": "qwen3-vl", "maxSteps": steps,
                                 "standardActionSpace": "pc",
                                 "model": {"baseUrl": model_url, "apiKey": key},
                                 "env": {"type": "genv", "gymBaseUrl": gym.url, "gymId": gym.gym_id,
                                         "executionId": executions[i % len(executions)]}})
            semaphore = asyncio.Semaphore(concurrency)
            retry = RetryPolicy(attempts=4, backoff_s=0.1)  # a pooled keep-alive may be closed under us

            async def get(path: str) -> dict:
                return (await send_with_retry(http, "GET", path, policy=retry, what=f"bench GET {path}")).json()

            async def one(body: dict) -> list[dict]:
                async with semaphore:
                    run_id = (await http.post("/runs", json=body)).json()["runId"]
                    while (status := await get(f"/runs/{run_id}"))["status"] == "running":
                        await asyncio.sleep(0.25)
                    if not status["ok"]:
                        raise RuntimeError(f"run failed: {status['reason']}")
                    return (await get(f"/runs/{run_id}/steps"))["steps"]

            cpu0, t0 = cpu_seconds(agent_pid), time.perf_counter()
            all_steps = [s for run in await asyncio.gather(*(one(p) for p in payloads)) for s in run]
            wall, cpu = time.perf_counter() - t0, cpu_seconds(agent_pid) - cpu0
        finally:
            for eid in executions:
                await g.terminate(eid)
    timing = [s["timing"] for s in all_steps]
    return {"concurrency": concurrency, "runs": total_runs, "steps": len(all_steps),
            "overhead_ms": stats([t["overheadMs"] for t in timing]),
            "step_ms": stats([t["stepMs"] for t in timing]),
            "model_ms": stats([t["modelMs"] for t in timing]),
            "gym_ms": stats([t["gymMs"] for t in timing]),
            "agent_cpu_ms_per_step": round(1000 * cpu / len(all_steps), 3),
            "steps_per_s": round(len(all_steps) / wall, 2)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per concurrency level (at least the level)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--concurrency", default="1,8,32")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    task_id = load_tasks().tasks[0].task_id

    model = ScriptedModel()
    model_server = serve_app_in_thread(build_model_app(model))
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "cua_rl.local_agent", "serve", "--port", str(port),
                              "--log-level", "warning"], stdout=subprocess.DEVNULL)
    agent_url = f"http://127.0.0.1:{port}"
    try:
        with start_gym_server(port=0, max_executions=6, display_base=800) as gym:  # clear of other gyms
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"{agent_url}/health", timeout=2)
                    break
                except httpx.TransportError:
                    if agent.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("agent service did not start")
                    time.sleep(0.2)
            results = [await measure(agent_url, agent.pid, gym, model, model_server.url + "/v1", task_id,
                                     c, args.runs, args.steps, i) for i, c in enumerate(levels)]
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        model_server.stop()
    print(json.dumps({"bench": "agent_overhead_per_step", "task": task_id, "steps_per_run": args.steps,
                      "screen": "1280x800 PNG", "cpus": os.cpu_count(), "python": platform.python_version(),
                      "results": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
