"""The learning gate's false-pass rate and power, measured: every GRPO seed and every shuffled-rewards control
seed of one or more learning-bench runs, each judged by the gate, one JSON per seed and one summary.

Why: one CI run of the gate is one draw. Before this calibration a run with no signal (rewards shuffled within
each group) passed the old gate about one time in five. Here the gate's bar is fixed first (the learning bench's
docstring, THE BAR), then many seeds of both kinds are run from one pinned warm start
(tests/data/warm-starts/multiturn) and the outcome counted:

- ``null``: the controls (no signal): ``runs``, ``passed``, the two-sided 95% Clopper-Pearson upper bound of their
  pass rate (``cp95_upper``) and ``p_pass_fit``, a normal fit to the controls' gate statistic (the smallest
  biased-slice gain, ``learning_bench.gate_statistic``) giving the chance that it reaches the bar's
  ``SLICE_GAIN`` in one run (and ``p_pass_fit_with_rerun``: with CI's one rerun);
- ``power``: the GRPO seeds: ``runs``, ``passed``, the Clopper-Pearson lower bound (``cp95_lower``) and the same
  normal fit's chance of passing;
- ``warm_starts``: the warm start(s) the runs trained from; ``bar``: the bar they were judged by.

The runs come from ``python bench/learning_bench.py --recipe multiturn --warm-start DIR --rl-seeds N
--controls shuffled_rewards --control-seeds M ...`` (its ``--workdir``/``--reuse-runs`` let them be spread
over days; each invocation's JSON is one input here):

    python bench/gate_calibration.py LEARNING_JSON [LEARNING_JSON ...] --out-dir docs/bench/calibration \
        [--run-logs WORKDIR/fileroot/logs/USER/EXPERIMENT]

``--run-logs``: the runs' log directories' parent; each seed's record then holds its ``slice_walk``
(bench/slice_walk.py: the sampled probability of the right key on the biased slice per step, from what the
run recorded) and the summary the first and last steps' figures of every run, so a control that passed can be
told from one that drifted: where the warm start's margin sat and how far each run moved it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """A bench script of this folder as a module (``learning_bench``, ``slice_walk``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    return _load("learning_bench")


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


def _solve(f, target: float) -> float:
    """The p in [0, 1] where the decreasing function ``f`` equals ``target`` (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if f(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def clopper_pearson(passed: int, runs: int, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided (1 - alpha) Clopper-Pearson interval of a pass rate from ``passed`` of ``runs``."""
    upper = 1.0 if passed == runs else _solve(lambda p: _binomial_cdf(passed, runs, p), alpha / 2)
    # the lower bound of the pass rate is one minus the upper bound of the failure rate
    lower = 0.0 if passed == 0 else 1 - _solve(lambda q: _binomial_cdf(runs - passed, runs, q), alpha / 2)
    return round(lower, 4), round(upper, 4)


def normal_tail(values: list[float], threshold: float) -> float | None:
    """P(a draw >= ``threshold``) under a normal fit (mean, sample sd) to ``values``; None below two values."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    if sd == 0:
        return 1.0 if mean >= threshold else 0.0
    return round(0.5 * math.erfc((threshold - mean) / (sd * math.sqrt(2))), 5)


def seed_records(result: dict, source: str) -> list[dict]:
    """One record per judged run of a learning-bench JSON: GRPO seeds and shuffled-rewards control seeds."""
    bench = _bench()
    warm = str(result.get("sft", {}).get("checkpoint") or result.get("warm_start_dir"))
    if "tests/data/warm-starts/" in warm:   # the pinned warm start, whichever clone ran it
        warm = "tests/data/warm-starts/" + warm.split("tests/data/warm-starts/", 1)[1] + " (pinned)"
    records = []

    def record(kind: str, seed: int, run: dict) -> dict:
        gate = run.get("gate")
        return {"kind": kind, "seed": seed, "source": source, "warm_start": warm, "passed": not run["gate_failures"],
                "gate_statistic": bench.gate_statistic(gate) if gate else None, "gate": gate,
                "gate_failures": run["gate_failures"], "regimes": run.get("regimes"),
                "rollout_success": run.get("rollout_success"), "served_versions": run.get("served_versions"),
                "use": run.get("use"), "steps": result.get("steps"), "bar": result.get("bar")}

    for run in result.get("seeds", []):
        records.append(record("grpo", run["seed"], run))
    control = result.get("controls", {}).get("shuffled_rewards")
    if control:
        for run in control.get("seeds") or [control]:
            if "seed" not in run:   # a bench JSON from before the control's entry named its seed
                raise SystemExit(f"{source}: a shuffled-rewards control without its seed; judge it again with "
                                 f"today's bench/learning_bench.py (--reuse-runs)")
            records.append(record("control", run["seed"], run))
    return records


def summarize(records: list[dict], threshold: float) -> dict:
    """The calibration: counts, Clopper-Pearson bounds and normal fits (module docstring)."""
    nulls = [r for r in records if r["kind"] == "control"]
    grpo = [r for r in records if r["kind"] == "grpo"]
    null_stat = [r["gate_statistic"] for r in nulls if r["gate_statistic"] is not None]
    grpo_stat = [r["gate_statistic"] for r in grpo if r["gate_statistic"] is not None]
    p_null = normal_tail(null_stat, threshold)
    return {
        "null": {"runs": len(nulls), "passed": sum(r["passed"] for r in nulls),
                 "cp95_upper": clopper_pearson(sum(r["passed"] for r in nulls), len(nulls))[1] if nulls else None,
                 "p_pass_fit": p_null,
                 "p_pass_fit_with_rerun": None if p_null is None else round(1 - (1 - p_null) ** 2, 5),
                 "gate_statistic": null_stat},
        "power": {"runs": len(grpo), "passed": sum(r["passed"] for r in grpo),
                  "cp95_lower": clopper_pearson(sum(r["passed"] for r in grpo), len(grpo))[0] if grpo else None,
                  "p_pass_fit": normal_tail(grpo_stat, threshold), "gate_statistic": grpo_stat},
        "warm_starts": sorted({str(r["warm_start"]) for r in records}),
    }


def run_label(kind: str, seed: int) -> str:
    """The learning bench's name of a seed's run (its trial and log directory)."""
    return f"grpo-s{seed}" if kind == "grpo" else _bench().control_label("shuffled_rewards", int(seed))


def add_walks(records: list[dict], run_logs: Path) -> dict:
    """Each record's ``slice_walk`` from its run's log directory under ``run_logs`` (absent runs: none), and the
    summary's per-kind list of (seed, first, last) pooled estimates."""
    walk = _load("slice_walk")
    summary: dict[str, list] = {"grpo": [], "control": []}
    for r in records:
        where = run_logs / run_label(r["kind"], r["seed"])
        if (where / "monitor" / "monitor.db").is_file():
            r["slice_walk"] = walk.walk(where)
            summary[r["kind"]].append({"seed": r["seed"], "first": r["slice_walk"]["first"],
                                       "last": r["slice_walk"]["last"],
                                       "mixed_groups": r["slice_walk"]["mixed_groups"]})
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="learning-bench JSON files (--recipe multiturn)")
    parser.add_argument("--out-dir", default="", help="write one JSON per seed and summary.json here")
    parser.add_argument("--run-logs", type=Path, help="the runs' log directories' parent (module docstring)")
    args = parser.parse_args(argv)
    bench = _bench()
    records = []
    for path in args.results:
        records += seed_records(json.loads(Path(path).read_text()), str(path))
    summary = {"calibration": {**summarize(records, bench.SLICE_GAIN), "bar": bench.BAR},
               "seeds": [{k: r[k] for k in ("kind", "seed", "passed", "gate_statistic", "gate_failures", "source")}
                         for r in records]}
    if args.run_logs:
        summary["slice_walk"] = add_walks(records, args.run_logs)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for r in records:
            (out / f"{r['kind']}-s{r['seed']}.json").write_text(json.dumps(r, indent=2) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
