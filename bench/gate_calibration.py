"""The learning gate's false-pass rate and power, measured: every GRPO seed and every shuffled-rewards control
seed of one or more learning-bench runs, each judged by the gate, one JSON per seed and one summary.

Why: one CI run of the gate is one draw. Before this calibration a run with no signal (rewards shuffled within
each group) passed the old gate about one time in five. Here the gate's bar is fixed first (the learning bench's
docstring, THE BAR), then many seeds of both kinds are run from one pinned warm start
(cua_rl/recipes/pinned/warm-starts/multiturn) and the outcome counted:

- ``null``: the controls (no signal): ``runs``, ``passed`` and ``evidence``, what the runs show: the count and
  the two-sided 95% Clopper-Pearson upper bound of the false-pass rate (``cp95_upper``; 0 of 8 -> 0.37);
- ``power``: the GRPO seeds: ``runs``, ``passed``, ``evidence`` and the Clopper-Pearson lower bound (``cp95_lower``);
- ``normal_fit_model`` beside each: a normal fit to the gate statistic (the smallest biased-slice gain,
  ``learning_bench.gate_statistic``) and its tail at the bar's ``SLICE_GAIN`` (``p_pass``, and with CI's one
  rerun). It is a model, named as one: it assumes a unimodal statistic, and on the three earlier tasks the
  controls' statistic was bimodal (``--earlier DIR ...`` puts each earlier calibration's statistic, count and fit
  beside it as ``normal_fit_on_earlier_tasks``). The count is the evidence;
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

``--resummarize DIR [--earlier DIR ...]`` rebuilds a calibration directory's summary.json from its per-seed JSONs
(nothing replayed, the slice walks kept), as docs/bench/calibration/drill-task/ was on 2026-12-07:

    python bench/gate_calibration.py --resummarize docs/bench/calibration/drill-task --earlier \
        docs/bench/calibration/{flailing,stopping,slip90}-demonstrator
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

from cua_rl.stats import clopper_pearson  # noqa: F401  (one implementation: cua_rl/stats.py)

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """A bench script of this folder as a module (``learning_bench``, ``slice_walk``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    return _load("learning_bench")


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
    for pins in ("tests/data/warm-starts/", "cua_rl/recipes/pinned/warm-starts/"):   # pinned: before and after 86
        if pins in warm:   # the pinned warm start, whichever clone ran it
            warm = pins + warm.split(pins, 1)[1] + " (pinned)"
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


NORMAL_FIT_MODEL = ("a model, not a count: a normal distribution fitted (mean, sample sd) to the controls' gate "
                    "statistic, and its tail at the bar. It assumes the statistic is unimodal; on the three earlier "
                    "tasks it was bimodal (most controls near 0, some flipped to GRPO's value: "
                    "normal_fit_on_earlier_tasks), where the fit and the counts disagree. The evidence is the count.")


def evidence(passed: int, runs: int, kind: str) -> str:
    """What the runs show, in words: the count and its exact bound."""
    low, high = clopper_pearson(passed, runs) if runs else (None, None)
    if kind == "control":
        return (f"{passed} of {runs} shuffled-reward controls passed the gate: false-pass rate per run at most "
                f"{high} (two-sided 95% Clopper-Pearson upper bound)")
    return f"{passed} of {runs} GRPO seeds passed the gate: power per run at least {low} (95% Clopper-Pearson lower bound)"


def summarize(records: list[dict], threshold: float) -> dict:
    """The calibration: counts and their Clopper-Pearson bounds (the evidence), and the normal fit beside them,
    named as the model it is (module docstring)."""
    nulls = [r for r in records if r["kind"] == "control"]
    grpo = [r for r in records if r["kind"] == "grpo"]
    null_stat = [r["gate_statistic"] for r in nulls if r["gate_statistic"] is not None]
    grpo_stat = [r["gate_statistic"] for r in grpo if r["gate_statistic"] is not None]
    p_null = normal_tail(null_stat, threshold)
    null_passed, grpo_passed = sum(r["passed"] for r in nulls), sum(r["passed"] for r in grpo)
    return {
        "null": {"runs": len(nulls), "passed": null_passed,
                 "evidence": evidence(null_passed, len(nulls), "control") if nulls else None,
                 "cp95_upper": clopper_pearson(null_passed, len(nulls))[1] if nulls else None,
                 "normal_fit_model": {"p_pass": p_null,
                                      "p_pass_with_rerun": None if p_null is None else round(1 - (1 - p_null) ** 2, 5),
                                      "what": NORMAL_FIT_MODEL},
                 "gate_statistic": null_stat},
        "power": {"runs": len(grpo), "passed": grpo_passed,
                  "evidence": evidence(grpo_passed, len(grpo), "grpo") if grpo else None,
                  "cp95_lower": clopper_pearson(grpo_passed, len(grpo))[0] if grpo else None,
                  "normal_fit_model": {"p_pass": normal_tail(grpo_stat, threshold),
                                       "what": "the same normal model, fitted to the GRPO seeds' statistic"},
                  "gate_statistic": grpo_stat},
        "warm_starts": sorted({str(r["warm_start"]) for r in records}),
    }


def earlier_task(directory: Path, threshold: float) -> dict:
    """One earlier calibration (a directory of per-seed JSONs) as the normal fit's check: the controls' statistic,
    what the counts say and what the fit said."""
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("control-s*.json"))]
    stat = [r["gate_statistic"] for r in records if r.get("gate_statistic") is not None]
    passed = sum(bool(r["passed"]) for r in records)
    return {"task": directory.name, "control_gate_statistic": stat, "passed": passed, "runs": len(records),
            "cp95_upper": clopper_pearson(passed, len(records))[1] if records else None,
            "normal_fit_p_pass": normal_tail(stat, threshold),
            "at_or_above_bar": sum(v >= threshold for v in stat), "near_zero": sum(abs(v) < 0.1 for v in stat)}


def resummarize(directory: Path, earlier: list[Path]) -> dict:
    """``directory``'s summary.json rebuilt from its per-seed JSONs (no run replayed; the slice walks kept), with
    the normal fit's record on the ``earlier`` calibrations beside it."""
    bench = _bench()
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("*-s*.json"))]
    old = json.loads((directory / "summary.json").read_text()) if (directory / "summary.json").exists() else {}
    calibration = {**summarize(records, bench.SLICE_GAIN), "bar": old.get("calibration", {}).get("bar", bench.BAR)}
    if earlier:
        calibration["normal_fit_on_earlier_tasks"] = [earlier_task(d, bench.SLICE_GAIN) for d in earlier]
    summary = {**old, "calibration": calibration}
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


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
    parser.add_argument("results", nargs="*", help="learning-bench JSON files (--recipe multiturn)")
    parser.add_argument("--out-dir", default="", help="write one JSON per seed and summary.json here")
    parser.add_argument("--run-logs", type=Path, help="the runs' log directories' parent (module docstring)")
    parser.add_argument("--resummarize", type=Path, help="rebuild this calibration directory's summary.json from "
                        "its per-seed JSONs (no results needed)")
    parser.add_argument("--earlier", type=Path, nargs="*", default=[], help="earlier calibration directories: the "
                        "normal fit's record on them goes beside it (normal_fit_on_earlier_tasks)")
    args = parser.parse_args(argv)
    if args.resummarize:
        summary = resummarize(args.resummarize, args.earlier)
        print(json.dumps(summary["calibration"], indent=2))
        return summary
    if not args.results:
        parser.error("give learning-bench JSON files, or --resummarize DIR")
    bench = _bench()
    records = []
    for path in args.results:
        records += seed_records(json.loads(Path(path).read_text()), str(path))
    calibration = {**summarize(records, bench.SLICE_GAIN), "bar": bench.BAR}
    if args.earlier:
        calibration["normal_fit_on_earlier_tasks"] = [earlier_task(d, bench.SLICE_GAIN) for d in args.earlier]
    summary = {"calibration": calibration,
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
