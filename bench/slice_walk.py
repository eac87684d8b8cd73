"""How a run's policy moved on the biased slice, step by step: the sampled probability of the right key where
the warm start is wrong, read from what the run recorded (no extra model call).

Why: the learning gate judges one greedy evaluation after the last step, so a run whose sampled probability of
the right key on yellow hovers near one half can end on either side of the greedy threshold. Where it started and
how far it moved per step (under GRPO: a drift; under a shuffled-reward control: a walk of random sign) is what
decides whether a run without signal can pass (docs/notes/learning-history.md, "The gate's false-pass rate and power").

For each training episode of a key-sequence family (key-sequence, its drill) whose instance shows a confused colour
(``curriculum.CONFUSIONS``) and that reached that square (every earlier key right), the decision there: the key
pressed and the behaviour logprob the policy endpoint recorded for its token (the monitor store of the run:
``<logs>/monitor/monitor.db``). The estimate of p(right key) from one decision is that probability when the right
key was pressed and one minus the pressed key's probability otherwise (an upper bound: other keys share it). Per
training step: the decisions, how many pressed the right key, the mean estimate, and the groups showing the colour
that were mixed (some episode succeeded and some did not: the only groups whose update moves anything).

    python bench/slice_walk.py RUN_LOG_DIR [RUN_LOG_DIR ...] [--out JSON]
    python bench/slice_walk.py --tasks RUN_LOG_DIR [RUN_LOG_DIR ...] [--out JSON]

A RUN_LOG_DIR is a run's log directory (``<fileroot>/logs/<user>/<experiment>/<trial>``); the JSON has one entry
per run: ``steps`` (the per-step figures, step 0 = the warm start's episodes) and ``first``/``last`` (the first
and last three steps' pooled estimate).

``--tasks`` walks any gym's run (MiniWoB++ pages: issue 85's yardstick) by task instead of by slice: per step, the
trained episodes, their successes, the groups that were mixed, and why the failed ones ended (``ended``: the
agent's reasons, shortened: "invalid replies", "max turns", "done (failed)", ...); per task, the sampled success of
the first and last three steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, select  # noqa: E402

from cua_rl.local_gym import load_tasks  # noqa: E402
from cua_rl.local_gym.curriculum import CONFUSIONS, SEQUENCE_FAMILIES, make_instance  # noqa: E402
from cua_rl.monitor.schema import TABLES  # noqa: E402


def _key(action_json: str | None) -> str | None:
    keys = json.loads(action_json or "{}").get("keys") or [None]
    return keys[0]


def _key_probability(tokens_json: str | None, key: str) -> float | None:
    """The recorded probability of the token that spelled ``key`` in the reply (the tool call's argument)."""
    tokens = json.loads(tokens_json or "{}")
    pieces, logprobs = tokens.get("pieces") or [], tokens.get("logprobs") or []
    for piece, logprob in zip(pieces, logprobs):
        if piece.strip('"') == key:
            return math.exp(logprob)
    return None


def _families(conn) -> dict[int, str | None]:
    """The curriculum family of each task row of a monitor store (its task id, ``054-key-sequence``, names an
    embedded gym task): key-sequence and key-sequence-drill draw different instances from one seed."""
    gym_tasks = load_tasks()
    return {row.id: getattr(gym_tasks.get(row.task_id), "family", None)
            for row in conn.execute(select(TABLES["tasks"].c.id, TABLES["tasks"].c.task_id))}


def _store(log_dir: Path):
    """The engine of a run's monitor store (``<logs>/monitor/monitor.db``)."""
    db = log_dir / "monitor" / "monitor.db"
    if not db.is_file():
        raise SystemExit(f"slice_walk: no monitor store at {db} (is {log_dir} a run's log directory?)")
    return create_engine(f"sqlite:///{db}")


def walk(log_dir: Path) -> dict:
    """The per-step figures of one run (its monitor store)."""
    engine = _store(log_dir)
    rollouts, turns, steps = TABLES["rollouts"], TABLES["turns"], TABLES["steps"]
    per_step: dict[int, dict] = defaultdict(lambda: {"decisions": 0, "right": 0, "estimates": [],
                                                     "groups": defaultdict(list)})
    with engine.connect() as conn:
        step_of = {row.id: row.step for row in conn.execute(select(steps.c.id, steps.c.step))}
        family_of = _families(conn)
        for r in conn.execute(select(rollouts).where(rollouts.c.is_eval.is_(False))):
            seed = json.loads(r.summary_json or "{}").get("seed")
            if seed is None or r.step_id not in step_of or family_of.get(r.task_id) not in SEQUENCE_FAMILIES:
                continue
            instance = make_instance(family_of[r.task_id], seed)
            shown = instance.content.split("-")
            confused = next((colour for colour in shown if colour in CONFUSIONS), None)
            if confused is None:
                continue
            at = shown.index(confused)
            figures = per_step[step_of[r.step_id]]
            figures["groups"][r.group_id].append(r.reward or 0.0)
            played = list(conn.execute(select(turns.c.turn, turns.c.action_json, turns.c.tokens_json)
                                       .where(turns.c.rollout_id == r.id).order_by(turns.c.turn)))
            right = [step["keys"][0] for step in instance.solution]
            if len(played) <= at or any(_key(played[i].action_json) != right[i] for i in range(at)):
                continue                                     # lost before the confused square
            pressed = _key(played[at].action_json)
            p = _key_probability(played[at].tokens_json, pressed) if pressed else None
            figures["decisions"] += 1
            figures["right"] += pressed == right[at]
            if p is not None:
                figures["estimates"].append(p if pressed == right[at] else 1.0 - p)
    out = []
    for step in sorted(per_step):
        f = per_step[step]
        mixed = sum(1 for rewards in f["groups"].values() if 0 < sum(x > 0 for x in rewards) < len(rewards))
        out.append({"step": step, "decisions": f["decisions"], "right": f["right"],
                    "p_right": round(sum(f["estimates"]) / len(f["estimates"]), 3) if f["estimates"] else None,
                    "groups": len(f["groups"]), "mixed_groups": mixed, "_estimates": f["estimates"]})
    pooled = lambda rows: (round(sum(e for r in rows for e in r["_estimates"]) /  # noqa: E731
                                 max(1, sum(len(r["_estimates"]) for r in rows)), 3) if rows else None)
    result = {"run": log_dir.name, "first": pooled(out[:3]), "last": pooled(out[-3:]),
              "mixed_groups": sum(r["mixed_groups"] for r in out)}
    for row in out:
        del row["_estimates"]
    result["steps"] = out
    return result


def _ended(summary: dict) -> str:
    """Why an episode ended, in a few words."""
    reason = str(summary.get("reason") or "")
    if summary.get("success"):
        return "success"
    if "invalid model replies" in reason:
        return "invalid replies"
    if "maxSteps" in reason or ("max" in reason and "turn" in reason):
        return "max turns"
    if "terminate" in reason:
        return "done (failed)"
    return summary.get("run_failure") or reason[:40] or "unknown"


def task_walk(log_dir: Path) -> dict:
    """The per-step and per-task figures of one run of any gym (its monitor store's training episodes)."""
    engine = _store(log_dir)
    rollouts, steps, tasks = TABLES["rollouts"], TABLES["steps"], TABLES["tasks"]
    per_step: dict[int, dict] = defaultdict(lambda: {"episodes": 0, "successes": 0, "groups": defaultdict(list),
                                                     "ended": defaultdict(int)})
    per_task: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    with engine.connect() as conn:
        step_of = {row.id: row.step for row in conn.execute(select(steps.c.id, steps.c.step))}
        name_of = {row.id: row.task_id for row in conn.execute(select(tasks.c.id, tasks.c.task_id))}
        for r in conn.execute(select(rollouts).where(rollouts.c.is_eval.is_(False))):
            if r.step_id not in step_of or r.reward is None:
                continue
            step, summary = step_of[r.step_id], json.loads(r.summary_json or "{}")
            won = bool(r.reward and r.reward > 0)
            f = per_step[step]
            f["episodes"] += 1
            f["successes"] += won
            f["groups"][r.group_id].append(won)
            f["ended"][_ended(summary)] += 1
            per_task[name_of.get(r.task_id, str(r.task_id))][step].append(won)
    out = [{"step": step, "episodes": f["episodes"], "successes": f["successes"], "groups": len(f["groups"]),
            "mixed_groups": sum(1 for g in f["groups"].values() if 0 < sum(g) < len(g)),
            "ended": dict(sorted(f["ended"].items()))} for step, f in sorted(per_step.items())]

    def rate(by_step: dict[int, list], chosen: list[int]) -> float | None:
        xs = [x for s in chosen for x in by_step.get(s, [])]
        return round(sum(xs) / len(xs), 3) if xs else None

    order = sorted(per_step)
    return {"run": log_dir.name, "mixed_groups": sum(r["mixed_groups"] for r in out),
            "groups": sum(r["groups"] for r in out),
            "tasks": {task: {"first": rate(by_step, order[:3]), "last": rate(by_step, order[-3:]),
                             "episodes": sum(len(v) for v in by_step.values())}
                      for task, by_step in sorted(per_task.items())},
            "steps": out}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log directories")
    parser.add_argument("--tasks", action="store_true", help="walk any gym's run by task (the module's docstring)")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    result = ({"by": "task", "runs": [task_walk(run) for run in args.runs]} if args.tasks else
              {"slice": sorted(CONFUSIONS), "runs": [walk(run) for run in args.runs]})
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
