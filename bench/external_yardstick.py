"""Issue 85's external yardstick: learning shown on MiniWoB++ (tasks no one here wrote), held out by task, judged
across seeds. This file holds the statistic, the exact permutation test, the bar and the writer of
docs/bench/external_yardstick.json; the task lists, the bar's numbers and the run counts are data, fixed before
any seed run in cua_rl/local_gym/external_yardstick_plan.json (its ``status`` says whether the held-out list is
still a set of candidates pending the pilot).

The design (the plan JSON has it word for word):

- one SFT warm start on scripted DOM demonstrations of ``train_tasks`` only (cua_rl/sft/miniwob_demos.py);
- from it, at least 5 GRPO runs and at least 5 shuffled-reward controls (different seeds);
- greedy success before (the warm start) and after (each run's last step) on 32 held-out seeds of every
  ``heldout_tasks`` task (tasks never demonstrated or trained) and of every ``train_tasks`` task (held-out seeds);
- per run: the held-out-task rise (mean over held-out tasks of after - before) and the held-out-seed rise (the
  same over the trained tasks' held-out seeds);
- the statistic: mean held-out-task rise of the GRPO runs minus that of the controls;
- its exact one-sided permutation p: over every relabelling of the runs into as many "GRPO" and "control" runs
  as there are (C(10, 5) = 252 for 5 + 5), the share whose statistic is at least the observed one; the observed
  labelling is one of them and ties count as at least as extreme (so p >= 1/252 with 5 + 5);
- the bar: p <= 0.05, GRPO's mean held-out-task rise >= +0.10 and its mean held-out-seed rise >= +0.15. If it is
  not met, the JSON says so with the per-task table against chance; the bar does not move.

Item 7, the three credit mutations (bench/learning_bench.py ``MUTATIONS``: ``batch_recentring``,
``shift_loss_mask``, ``gym_faults_as_policy``), one run each from the same warm start and recipe, seed 1, judged
by the same evaluation (``--mutation NAME:FILE``). The rule, fixed on 2026-12-07 before any mutation run ended
(``MUTATION_RULE``): the yardstick *sees* a mutation when its run's held-out-task rise is below every GRPO run's
and the bar was met (GRPO learned measurably); one run cannot be told from the GRPO runs otherwise. Each
mutation's rises, and how many GRPO runs and controls lie above it, are reported either way.

The seed session (docs/learning.md, "MiniWoB++ held out by task", has the commands) writes one ``cua-eval --suite
miniwob:yardstick --greedy --out FILE`` per checkpoint, then:

    python bench/external_yardstick.py --before WARM.json --grpo 1:G1.json ... --control 1:C1.json ... \
        --warm-start HASH --decided COMMIT [--cross-check AGREE/OF] --out docs/bench/external_yardstick.json
    python bench/external_yardstick.py --check-plan     # the plan's lists: disjoint, >= 3 each, served by the gym
    python bench/external_yardstick.py --pilot WARM.json  # which held-out candidates the warm start scores 0.1-0.7
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIE = 1e-9   # rises are means of 0/1 outcomes: two statistics this close are equal


def load_plan() -> dict:
    from cua_rl.local_gym.miniwob_suites import plan

    return plan()


def check_plan(plan: dict, served: list[str] | None = None) -> list[str]:
    """What is wrong with the plan (empty: nothing): the issue's minimums, disjoint lists, pages the gym serves."""
    from cua_rl.local_gym.miniwob_suites import SuiteError, split_tasks

    problems = []
    train, heldout = plan["train_tasks"], plan["heldout_tasks"]
    if len(train) < 3 or len(heldout) < 3:
        problems.append(f"at least 3 train and 3 held-out tasks, got {len(train)} and {len(heldout)}")
    if set(train) & set(heldout):
        problems.append(f"train and held-out tasks overlap: {sorted(set(train) & set(heldout))}")
    for split in ("yardstick-train", "yardstick-heldout"):
        try:
            split_tasks(split, served)
        except SuiteError as e:
            problems.append(str(e))
    seeds = plan["seeds"]
    if seeds["grpo"] < 5 or seeds["control"] < 5:
        problems.append(f"at least 5 GRPO seeds and 5 controls, got {seeds['grpo']} and {seeds['control']}")
    if plan["instances_per_heldout_task"] < 32:
        problems.append(f"at least 32 instances per held-out task, got {plan['instances_per_heldout_task']}")
    return problems


def mean(values: list[float]) -> float:
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)


def exact_permutation_p(grpo: list[float], control: list[float]) -> float:
    """One-sided exact permutation p of mean(grpo) - mean(control): over every way of choosing which len(grpo)
    of all the runs are labelled GRPO (the observed labelling included), the share whose difference of means is
    at least the observed one (ties, within ``TIE``, count as at least as extreme)."""
    if not grpo or not control:
        raise ValueError("the permutation test needs runs of both kinds")
    runs = list(grpo) + list(control)
    k, total = len(grpo), sum(runs)
    observed = mean(grpo) - mean(control)
    extreme = count = 0
    for picked in itertools.combinations(range(len(runs)), k):
        a = sum(runs[i] for i in picked)
        statistic = a / k - (total - a) / (len(runs) - k)
        count += 1
        extreme += statistic >= observed - TIE
    return extreme / count


def task_rise(rows: list[dict], tasks: list[str]) -> dict:
    """Per task the greedy success before and after over its rows (``{"task", "seed", "before", "after"}``), and
    the mean rise over ``tasks``."""
    per_task = {}
    for task in tasks:
        mine = [r for r in rows if r["task"] == task]
        if not mine:
            raise ValueError(f"no outcomes of task {task}")
        before, after = mean([r["before"] for r in mine]), mean([r["after"] for r in mine])
        per_task[task] = {"before": round(before, 4), "after": round(after, 4), "rise": round(after - before, 4),
                          "instances": len(mine)}
    return {"rise": mean([v["rise"] for v in per_task.values()]), "per_task": per_task}


def run_rises(run: dict, plan: dict) -> dict:
    """A run's held-out-task and held-out-seed rises (module docstring)."""
    tasks = task_rise(run["heldout_tasks"], plan["heldout_tasks"])
    seeds = task_rise(run["heldout_seeds"], plan["train_tasks"])
    return {"heldout_task_rise": round(tasks["rise"], 4), "heldout_seed_rise": round(seeds["rise"], 4),
            "heldout_task_table": tasks["per_task"], "heldout_seed_table": seeds["per_task"]}


def judge(grpo: list[dict], control: list[dict], plan: dict) -> dict:
    """The statistic, its permutation p and the bar, from the runs' rows."""
    bar = plan["bar"]
    g = [run_rises(r, plan) for r in grpo]
    c = [run_rises(r, plan) for r in control]
    g_task, c_task = [x["heldout_task_rise"] for x in g], [x["heldout_task_rise"] for x in c]
    p = exact_permutation_p(g_task, c_task)
    grpo_task, grpo_seed = mean(g_task), mean([x["heldout_seed_rise"] for x in g])
    why_not = []
    if p > bar["permutation_p_max"]:
        why_not.append(f"permutation p {p:.4f} > {bar['permutation_p_max']}")
    if grpo_task < bar["grpo_mean_heldout_task_rise_min"]:
        why_not.append(f"GRPO's mean held-out-task rise {grpo_task:+.4f} < +{bar['grpo_mean_heldout_task_rise_min']}")
    if grpo_seed < bar["grpo_mean_heldout_seed_rise_min"]:
        why_not.append(f"GRPO's mean held-out-seed rise {grpo_seed:+.4f} < +{bar['grpo_mean_heldout_seed_rise_min']}")
    if len(grpo) < plan["seeds"]["grpo"] or len(control) < plan["seeds"]["control"]:
        why_not.append(f"{len(grpo)} GRPO runs and {len(control)} controls; the plan asks for "
                       f"{plan['seeds']['grpo']} and {plan['seeds']['control']}")
    return {"statistic": round(grpo_task - mean(c_task), 4), "permutation_p": round(p, 6),
            "relabellings": len(list(itertools.combinations(range(len(g_task) + len(c_task)), len(g_task)))),
            "grpo_mean_heldout_task_rise": round(grpo_task, 4), "grpo_mean_heldout_seed_rise": round(grpo_seed, 4),
            "control_mean_heldout_task_rise": round(mean(c_task), 4),
            "control_mean_heldout_seed_rise": round(mean([x["heldout_seed_rise"] for x in c]), 4),
            "met": not why_not, "why_not": why_not,
            "runs": {"grpo": g, "control": c}}


def rows_from_eval(before: dict, after: dict, tasks: list[str]) -> list[dict]:
    """``{"task", "seed", "before", "after"}`` rows of ``tasks`` from two ``cua-eval`` results of one checkpoint
    each (their ``outcomes``: [task, seed, successes, ...]; greedy plays each instance once). Both must have
    played the same instances."""
    def by_instance(result: dict) -> dict:
        return {(o[0], o[1]): int(o[2]) for o in result["outcomes"] if o[0] in tasks}

    b, a = by_instance(before), by_instance(after)
    if set(b) != set(a):
        raise ValueError(f"before and after played different instances: {sorted(set(b) ^ set(a))[:5]} ...")
    return [{"task": t, "seed": s, "before": min(b[(t, s)], 1), "after": min(a[(t, s)], 1)} for t, s in sorted(b)]


def run_entry(seed: int, warm_start: str, before: dict, after: dict, plan: dict) -> dict:
    return {"seed": seed, "warm_start": warm_start,
            "heldout_tasks": rows_from_eval(before, after, plan["heldout_tasks"]),
            "heldout_seeds": rows_from_eval(before, after, plan["train_tasks"])}


def document(plan: dict, grpo: list[dict], control: list[dict], *, warm_start: str, decided: str,
             cross_check: dict | None, chance: dict | None = None) -> dict:
    """docs/bench/external_yardstick.json, in issue 85's schema (``external_yardstick``) plus ``verdict`` (the
    statistic, the bar's checks and the per-task tables)."""
    from cua_rl.local_gym.miniwob_suites import chance as chance_of

    tasks = plan["train_tasks"] + plan["heldout_tasks"]
    if chance is None:
        chance = {t: ((chance_of(t) or {}).get("target") or {}).get("rate") for t in tasks}
    verdict = judge(grpo, control, plan)
    bar = {k: v for k, v in plan["bar"].items() if k != "decided"}
    planned = {"grpo": plan["seeds"]["grpo"], "control": plan["seeds"]["control"]}
    return {"external_yardstick": {
        # complete: every run the plan asks for has been judged; until then the verdict is on the runs so far
        "complete": len(grpo) >= planned["grpo"] and len(control) >= planned["control"], "runs_planned": planned,
        "suite": "miniwob", "train_tasks": plan["train_tasks"], "heldout_tasks": plan["heldout_tasks"],
        "chance": chance, "bar": {**bar, "decided": decided}, "warm_start": warm_start,
        "grpo": grpo, "control": control, "permutation_p": verdict["permutation_p"],
        "cross_check": cross_check or {"agree": None, "of": 0}},
        "verdict": verdict}


MUTATION_RULE = ("seen: the mutation run's held-out-task rise is below every GRPO run's, and the bar was met "
                 "(fixed 2026-12-07 before any mutation run ended)")


def judge_mutations(mutations: list[tuple[str, dict]], verdict: dict, plan: dict) -> list[dict]:
    """Each mutation run's rises beside the GRPO runs and controls (``MUTATION_RULE``)."""
    g_task = [r["heldout_task_rise"] for r in verdict["runs"]["grpo"]]
    c_task = [r["heldout_task_rise"] for r in verdict["runs"]["control"]]
    out = []
    for name, run in mutations:
        rises = run_rises(run, plan)
        task = rises["heldout_task_rise"]
        out.append({"mutation": name, "seed": run["seed"], "heldout_task_rise": task,
                    "heldout_seed_rise": rises["heldout_seed_rise"],
                    "grpo_runs_above": sum(x > task for x in g_task), "controls_above": sum(x > task for x in c_task),
                    "seen": bool(verdict["met"] and all(x > task for x in g_task)),
                    "heldout_task_table": rises["heldout_task_table"],
                    "heldout_seed_table": rises["heldout_seed_table"]})
    return out


def validate(doc: dict) -> list[str]:
    """The schema issue 85 asks for: what is missing or malformed (empty: nothing)."""
    problems = []
    y = doc.get("external_yardstick")
    if not isinstance(y, dict):
        return ["no external_yardstick object"]
    for key in ("suite", "train_tasks", "heldout_tasks", "chance", "bar", "warm_start", "grpo", "control",
                "permutation_p", "cross_check"):
        if key not in y:
            problems.append(f"missing {key}")
    if y.get("suite") != "miniwob":
        problems.append("suite must be 'miniwob'")
    if not (y.get("bar") or {}).get("decided"):
        problems.append("bar.decided must name the commit that fixed the lists and the bar")
    for kind in ("grpo", "control"):
        for run in y.get(kind, []):
            for part in ("heldout_tasks", "heldout_seeds"):
                for row in run.get(part, []):
                    if set(row) != {"task", "seed", "before", "after"} or row["before"] not in (0, 1) \
                            or row["after"] not in (0, 1):
                        problems.append(f"{kind} seed {run.get('seed')}: bad {part} row {row}")
                        break
    check = y.get("cross_check", {})
    if set(check) != {"agree", "of"}:
        problems.append("cross_check must be {agree, of}")
    return problems


PILOT_RANGE = (0.1, 0.7)   # the issue's: a held-out task the warm start scores within this is kept


def pilot(warm: dict, plan: dict) -> dict:
    """The pilot's choice from the warm start's greedy ``cua-eval`` result: each held-out candidate's score, which
    lie within ``PILOT_RANGE`` (kept) and which not (dropped). It changes nothing: the plan is edited and committed
    by hand, before any seed run, and only when at least 3 remain."""
    scores = {t: task_rise([{"task": o[0], "seed": o[1], "before": min(int(o[2]), 1), "after": 0}
                            for o in warm["outcomes"] if o[0] == t], [t])["per_task"][t]["before"]
              for t in plan["heldout_tasks"]}
    low, high = PILOT_RANGE
    keep = [t for t, v in scores.items() if low <= v <= high]
    return {"scores": scores, "range": list(PILOT_RANGE), "keep": keep,
            "drop": [t for t in scores if t not in keep], "enough": len(keep) >= 3}


def _labelled(values: list[str]) -> list[tuple[int, Path]]:
    out = []
    for v in values:
        seed, _, path = v.partition(":")
        out.append((int(seed), Path(path)))
    return out


def _greedy(path: Path) -> dict:
    """The greedy result of a ``cua-eval --out`` file (a list of per-checkpoint results)."""
    results = json.loads(path.read_text())
    greedy = [r for r in results if r.get("greedy")]
    if len(greedy) != 1:
        raise SystemExit(f"{path}: expected one greedy result of one checkpoint, found {len(greedy)}")
    return greedy[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-plan", action="store_true", help="check the committed plan and print it")
    ap.add_argument("--pilot", type=Path, help="the warm start's cua-eval --suite miniwob:yardstick --greedy --out: "
                    "print which held-out candidates score within 0.1-0.7 (changes nothing)")
    ap.add_argument("--before", type=Path, help="cua-eval --suite miniwob:yardstick --greedy --out of the warm start")
    ap.add_argument("--grpo", nargs="*", default=[], help="SEED:FILE, each GRPO run's last step's cua-eval --out")
    ap.add_argument("--control", nargs="*", default=[], help="SEED:FILE, each control's last step's cua-eval --out")
    ap.add_argument("--mutation", nargs="*", default=[], help="NAME:FILE, each credit mutation run's last step's "
                    "cua-eval --out (item 7; judged by MUTATION_RULE)")
    ap.add_argument("--warm-start", default="", help="the warm start's hash (its directory's key)")
    ap.add_argument("--decided", default="", help="the commit that fixed the lists and the bar")
    ap.add_argument("--cross-check", default="", help="AGREE/OF: episodes whose rewards agree with the package's env")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    plan = load_plan()
    problems = check_plan(plan)
    if args.pilot:
        print(json.dumps(pilot(_greedy(args.pilot), plan), indent=1))
        return 0
    if args.check_plan or not args.before:
        print(json.dumps({"plan": plan, "problems": problems}, indent=1))
        return 1 if problems else 0
    before = _greedy(args.before)
    grpo = [run_entry(s, args.warm_start, before, _greedy(p), plan) for s, p in _labelled(args.grpo)]
    control = [run_entry(s, args.warm_start, before, _greedy(p), plan) for s, p in _labelled(args.control)]
    check = None
    if args.cross_check:
        agree, of = (int(x) for x in args.cross_check.split("/"))
        check = {"agree": agree, "of": of}
    doc = document(plan, grpo, control, warm_start=args.warm_start, decided=args.decided, cross_check=check)
    if args.mutation:
        runs = [(name, run_entry(1, args.warm_start, before, _greedy(Path(path)), plan))
                for name, _, path in (m.partition(":") for m in args.mutation)]
        doc["external_yardstick"]["mutations"] = judge_mutations(runs, doc["verdict"], plan)
        doc["external_yardstick"]["mutation_rule"] = MUTATION_RULE
    bad = validate(doc)
    if bad:
        raise SystemExit("the yardstick JSON is incomplete: " + "; ".join(bad))
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: v for k, v in doc["verdict"].items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
