"""The trainer's time per step with and without local shards (cua_rl/areal_ext/local_shards.py); prints JSON.

    python bench/trainer_bench.py [--steps 4] [--config examples/cua_agent/config.multiturn.yaml]

Runs the user's command twice, one after the other on this machine: ``train.sh`` on the multi-turn recipe
(real desktops, agent service, vLLM on the CPU, AReaL's FSDP trainer), first with the patch off
(``CUA_RL_AREAL_LOCAL_SHARDS=0``: AReaL fetches the shards a worker holds itself over its own HTTP server),
then on (the default). From each run's own records:
  - ``train_step_s``, ``recompute_logp_s``, ``compute_advantage_s``: AReaL's ``timeperf`` statistics, the
    median over the steps after the first (the first step also waits for the first rollouts);
  - ``step_s``: the console's wall time per step, same median; ``run_s``: ``train.sh`` from start to exit;
  - ``rollout_success``: per policy version, from the run's Training Monitor (bench/learning_bench.py
    ``run_record``: each episode once, under the version that started it), so a change in what was trained
    would show.
``ratio`` is on/off for each. The run trains for real (the warm start is built once and reused), so the
steps of the two runs see different episodes; the medians over steps 2.. are what compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from learning_bench import run_record  # noqa: E402

from cua_rl.run.launch import load_config  # noqa: E402
from cua_rl.run.summary import read_scalars  # noqa: E402
from cua_rl.trainer.progress import read_metrics  # noqa: E402

TIMEPERF = {"train_step_s": "timeperf/train_step", "recompute_logp_s": "timeperf/recompute_logp",
            "compute_advantage_s": "timeperf/compute_advantage"}


def _median_after_first(values: list[float]) -> float | None:
    return round(statistics.median(values[1:]), 2) if len(values) > 1 else None


def _run(name: str, config: str, steps: int, work: Path, local_shards: bool) -> dict:
    env = {**os.environ, "CUA_RL_FILEROOT": str(work / "fileroot"),
           "CUA_RL_AREAL_LOCAL_SHARDS": "1" if local_shards else "0"}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "examples/cua_agent/train.sh"), "--config", config,
                           f"total_train_steps={steps}", f"trial_name={name}", "existing_run=overwrite", "seed=1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    (work / f"{name}.log").write_text(out)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: train.sh exited {proc.returncode}; log {work / name}.log:\n{out[-3000:]}")
    logs = next((work / "fileroot" / "logs").rglob(f"{name}/metrics.jsonl")).parent
    scalars = read_scalars(logs)
    record = {key: _median_after_first([v for _, v in scalars.get(tag, [])]) for key, tag in TIMEPERF.items()}
    record["step_s"] = _median_after_first([r["step_seconds"] for r in read_metrics(logs)])
    experiment = load_config(config, []).experiment_name
    record["rollout_success"] = run_record(work, experiment, name, steps)["rollout_success"]
    record["run_s"] = round(time.monotonic() - started, 1)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--config", default="examples/cua_agent/config.multiturn.yaml")
    ap.add_argument("--workdir", default=None, help="kept when given (default: a temporary directory)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="trainer-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    off = _run("self-fetch", args.config, args.steps, work, local_shards=False)
    on = _run("local-shards", args.config, args.steps, work, local_shards=True)
    ratio = {k: round(on[k] / off[k], 3) for k in (*TIMEPERF, "step_s") if on[k] and off[k]}
    print(json.dumps({"config": args.config, "steps": args.steps, "self_fetch": off, "local_shards": on,
                      "ratio_on_over_off": ratio, "workdir": str(work)}, indent=1))


if __name__ == "__main__":
    main()
