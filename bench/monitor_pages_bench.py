"""Benchmark: how long our Training Monitor takes to serve a long run's page; prints one JSON object.

A run of ``--rollouts`` rollouts (default 10,000: GRPO groups of 16 per step, and an evaluation of 64 every
``--eval-every`` steps) is written to a fresh store through the real ingest API, then the run page is loaded
as the browser loads it, ``--repeat`` times: the page (HTML, app.js), the run's JSON (``/api/trainings/{id}``:
summaries per step, eval and baseline, curves) and the first page of its rollouts
(``/api/trainings/{id}/rollouts?limit=50``), one after another on one connection; the page refreshes every
few seconds by asking for the two JSON documents again. Also timed: a filtered page, a page deep in the list,
and the CSV export of every rollout. Issue 37's bar: the run page in at most 1 s at 10,000 rollouts.

``--against REV``: the same measurements with the monitor of another commit (a git worktree, imported in a
child process) in the same run, and the ratio; a route that commit does not have is reported as null.

  python bench/monitor_pages_bench.py                          # ~1 min on 2 cores
  python bench/monitor_pages_bench.py --against HEAD~5 --rollouts 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP = 16


async def _fill(url: str, token: str, rollouts: int, eval_every: int) -> tuple[int, dict]:
    """The run, through the ingest API: (training id, what was written)."""
    from cua_rl.monitor import MonitorClient
    from cua_rl.monitor.records import eval_record, rollout_result, step_record, task_record, training_start

    async with MonitorClient(url, token, project_id="bench") as client:
        started = await client.ingest(training=training_start("bench", "long-run"))
        tid = started.training_id
        tasks = [task_record(f"task-{i}", f"Task number {i}") for i in range(8)]
        steps, evals, written = [], [], {"step": 0, "eval": 0}
        n_steps = 0
        while (n_steps + 1) * GROUP + (len(evals) + (1 if (n_steps + 1) % eval_every == 0 else 0)) * 64 <= rollouts:
            n_steps += 1
            steps.append(step_record(tid, n_steps, status="completed"))
            if n_steps % eval_every == 0:
                evals.append(eval_record(tid, n_steps, status="completed"))
        parents = await client.ingest(records=[*tasks, *steps, *evals])
        task_ids = [parents.id_of("tasks", t.client_id) for t in tasks]
        batch = []

        async def flush() -> None:
            if batch:
                await client.ingest(records=batch)
                batch.clear()

        def add(link: dict, i: int, source: str) -> None:
            reward = float((i * 7919) % 3 == 0)
            batch.append(rollout_result(uuid.uuid4().hex, reward=reward, task_success=reward > 0.5, num_turns=4,
                                        task_id=task_ids[i % len(task_ids)], source_type=source,
                                        group_id=f"g{i // GROUP}", env_index=i % GROUP, **link))
            written[source] += 1

        i = 0
        for s in steps:
            for _ in range(GROUP):
                add({"step_id": parents.id_of("steps", s.client_id)}, i, "step")
                i += 1
            if len(batch) >= 512:
                await flush()
        for e in evals:
            for _ in range(64):
                add({"eval_id": parents.id_of("evals", e.client_id)}, i, "eval")
                i += 1
            if len(batch) >= 512:
                await flush()
        await flush()
    return tid, written


def measure(rollouts: int, eval_every: int, repeat: int) -> dict:
    """Everything in this process: the monitor (of whatever ``cua_rl`` is on the path), the run, the timings."""
    import httpx

    from cua_rl.monitor.embedded import start_monitor

    with tempfile.TemporaryDirectory() as tmp:
        monitor = start_monitor(Path(tmp) / "monitor")
        try:
            token = monitor.store.create_token("bench")
            t0 = time.perf_counter()
            tid, written = asyncio.run(_fill(monitor.url, token, rollouts, eval_every))
            fill_s = time.perf_counter() - t0
            with httpx.Client(base_url=monitor.url, timeout=120) as api:
                def timed(path: str) -> float | None:
                    samples = []
                    for _ in range(repeat):
                        t = time.perf_counter()
                        r = api.get(path)
                        samples.append(time.perf_counter() - t)
                        if r.status_code == 404:
                            return None
                        r.raise_for_status()
                    return round(statistics.median(samples) * 1000, 1)

                run_json = timed(f"/api/trainings/{tid}")
                first = timed(f"/api/trainings/{tid}/rollouts?limit=50")
                page = [timed(f"/{tid}"), timed("/static/app.js")]
                out = {
                    "rollouts": sum(written.values()), "written": written, "fill_s": round(fill_s, 1),
                    "run_json_ms": run_json, "rollouts_page_ms": first,
                    # a commit without the rollouts route listed its latest rollouts in the run's JSON
                    "page_load_ms": round(sum(page) + run_json + (first or 0), 1),
                    "refresh_ms": round(run_json + (first or 0), 1),
                    "run_json_bytes": len(api.get(f"/api/trainings/{tid}").content),
                    "filtered_page_ms": timed(f"/api/trainings/{tid}/rollouts?limit=50&task=task-3&min_reward=0.5"),
                    "deep_page_ms": timed(f"/api/trainings/{tid}/rollouts?limit=50&offset={max(0, rollouts - 100)}"),
                    "csv_export_ms": timed(f"/api/trainings/{tid}/rollouts.csv"),
                }
        finally:
            monitor.stop()
    return out


def _against(rev: str, args) -> dict:
    """``measure`` with the monitor of commit ``rev``: a worktree, this file run there as a child."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            proc = subprocess.run([sys.executable, __file__, "--source", str(tree), "--rollouts", str(args.rollouts),
                                   "--eval-every", str(args.eval_every), "--repeat", str(args.repeat)], cwd=tree,
                                  capture_output=True, text=True, check=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--repeat", type=int, default=5, help="requests per measurement (the median is reported)")
    ap.add_argument("--against", default="", help="also measure the monitor of this commit (a worktree)")
    ap.add_argument("--source", default=str(ROOT), help="the checkout whose cua_rl is measured (default: this one)")
    args = ap.parse_args()
    sys.path.insert(0, args.source)
    import cua_rl

    result = {"monitor": str(Path(cua_rl.__file__).parent), **measure(args.rollouts, args.eval_every, args.repeat)}
    if args.against:
        before = _against(args.against, args)
        result = {"after": result, "before": {"rev": args.against, **before},
                  "speedup_page_load": round(before["page_load_ms"] / result["page_load_ms"], 2),
                  "speedup_refresh": round(before["refresh_ms"] / result["refresh_ms"], 2)}
    result["page_load_ms_at_most_1000"] = (result.get("after") or result)["page_load_ms"] <= 1000
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
