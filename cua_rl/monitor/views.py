"""Read side of the run store: the JSON the viewer pages render (runs, steps, GRPO groups, rollouts).

Why the run page aggregates in SQL: a long run has tens of thousands of rollouts, and the page refreshes every
few seconds; counts and sums per step, eval and baseline (GROUP BY, CASE: the same on SQLite and PostgreSQL)
keep it at a few rows per step however many rollouts there are, and the rollouts themselves come a page at a
time (``rollouts_page``, filtered by task, status, source and reward) or all at once as CSV/JSONL
(``rollouts_export``). A step's GRPO groups (a few dozen rollouts) are still summarised in Python.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterable

from sqlalchemy import case, func, or_, select, true

from .schema import TABLES
from .store import Store

T = TABLES
_ROLLOUT_COLUMNS = ("id", "client_id", "status", "reward", "advantage", "task_success", "num_turns", "group_id",
                    "env_index", "step_id", "eval_id", "baseline_id", "task_id", "source_type", "start_time",
                    "end_time", "current_phase")


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _row(row) -> dict[str, Any]:
    d = dict(row._mapping)
    extra = d.pop("extra", None) or {}
    return {**extra, **d}


def _rows(conn, query) -> list[dict[str, Any]]:
    return [_row(r) for r in conn.execute(query)]


def summarise(rollouts: Iterable[dict]) -> dict[str, Any]:
    """Counts by status, mean reward and success rate of the finished (completed) rollouts."""
    rollouts = list(rollouts)
    done = [r for r in rollouts if r.get("status") == "completed" and r.get("reward") is not None]
    counts: dict[str, int] = defaultdict(int)
    for r in rollouts:
        counts[r.get("status") or "unknown"] += 1
    return {"rollouts": len(rollouts), "by_status": dict(counts), "completed": len(done),
            "reward_mean": sum(r["reward"] for r in done) / len(done) if done else None,
            "success_rate": sum(bool(r.get("task_success")) for r in done) / len(done) if done else None}


def _summary_sql(conn, link, where) -> dict[Any, dict[str, Any]]:
    """``summarise`` in SQL: per value of ``link`` (a step, eval or baseline id), over the rollouts ``where``."""
    r = T["rollouts"]
    done = (r.c.status == "completed") & r.c.reward.is_not(None)
    rows = conn.execute(select(link, r.c.status, func.count(), func.sum(case((done, 1), else_=0)),
                               func.sum(case((done, r.c.reward), else_=0.0)),
                               func.sum(case((done & (r.c.task_success == true()), 1), else_=0)))
                        .where(where).group_by(link, r.c.status)).all()
    parts: dict[Any, list] = defaultdict(list)
    for key, status, n, completed, reward, success in rows:
        parts[key].append((status, n, completed or 0, reward or 0.0, success or 0))
    return {key: _summary_of(counts) for key, counts in parts.items()}


def _summary_of(counts: list[tuple]) -> dict[str, Any]:
    """(status, rollouts, completed, reward sum, successes) rows -> ``summarise``'s dict."""
    by_status: dict[str, int] = defaultdict(int)
    for status, n, *_ in counts:
        by_status[status or "unknown"] += n
    done = sum(c[2] for c in counts)
    reward, success = sum(c[3] for c in counts), sum(c[4] for c in counts)
    return {"rollouts": sum(c[1] for c in counts), "by_status": dict(by_status), "completed": done,
            "reward_mean": reward / done if done else None, "success_rate": success / done if done else None}


def trainings(store: Store) -> list[dict[str, Any]]:
    t, r = T["trainings"], T["rollouts"]
    names = store.project_names()
    with store.engine.connect() as conn:
        runs = _rows(conn, select(t).order_by(t.c.id.desc()))
        counts = dict(conn.execute(select(r.c.training_id, func.count()).group_by(r.c.training_id)).all())
    for run in runs:
        run.pop("config_json", None)
        run["project"] = names.get(run["project_id"])
        run["num_rollouts"] = counts.get(run["id"], 0)
    return runs


def training(store: Store, training_id: int) -> dict[str, Any] | None:
    t, r = T["trainings"], T["rollouts"]
    with store.engine.connect() as conn:
        found = conn.execute(select(t).where(t.c.id == training_id)).first()
        if found is None:
            return None
        run = _row(found)
        run["config"] = _loads(run.pop("config_json", None))
        run["project"] = store.project_names().get(run["project_id"])
        mine = r.c.training_id == training_id
        parts = {kind: _rows(conn, select(T[kind]).where(T[kind].c.training_id == training_id)
                             .order_by(T[kind].c.step, T[kind].c.id)) for kind in ("steps", "evals", "baselines")}
        sums = {kind: _summary_sql(conn, r.c[f"{kind[:-1]}_id"], mine & r.c[f"{kind[:-1]}_id"].is_not(None))
                for kind in parts}
        train = _summary_sql(conn, r.c.training_id, mine & r.c.step_id.is_not(None))
        run["recent_rollouts"] = _rows(conn, select(*(r.c[c] for c in _ROLLOUT_COLUMNS)).where(mine)
                                       .order_by(r.c.id.desc()).limit(20))
    run.update({kind: _with_summaries(rows, sums[kind], run.get("status")) for kind, rows in parts.items()})
    run["summary"] = train.get(training_id) or _summary_of([])
    run["curve"] = [{"step": s["step"], "reward_mean": s["summary"]["reward_mean"],
                     "success_rate": s["summary"]["success_rate"]} for s in run["steps"]
                    if s["summary"]["completed"]]
    # held-out success: the evaluations during training and the baseline before it, by step
    run["heldout_curve"] = [{"step": p["step"], "kind": kind[:-1], "success_rate": p["summary"]["success_rate"],
                             "reward_mean": p["summary"]["reward_mean"], "completed": p["summary"]["completed"]}
                            for kind in ("baselines", "evals") for p in run[kind] if p["summary"]["completed"]]
    # what the trainer sent after each update (cua_rl.monitor.records.update_record), in the step rows' extra
    updates = [(s["step"], s["update"]) for s in run["steps"] if isinstance(s.get("update"), dict)]
    run["update_curve"] = [{"step": step, "train_step": u.get("train_step"), **(u.get("stats") or {})}
                           for step, u in updates]
    run["anomalies"] = [{"step": step, "train_step": u.get("train_step"), **a}
                        for step, u in updates for a in u.get("anomalies") or []]
    return run


def _with_summaries(parents: list[dict], sums: dict[int, dict], run_status: str | None) -> list[dict]:
    for i, p in enumerate(parents):
        p["summary"] = sums.get(p["id"]) or _summary_of([])
        p["status"] = parent_status(p.get("status"), p["summary"], run_status, latest=i == len(parents) - 1)
    return parents


def parent_status(recorded: str | None, summary: dict, run_status: str | None, *, latest: bool) -> str | None:
    """What a step, eval or baseline shows. Rollout workers open these rows ("running") but nothing marks
    one finished, so it is derived: still running while the run runs and it has running rollouts or is the
    newest; otherwise "completed" when any of its rollouts completed, else "cancelled" (e.g. the rollouts
    read ahead for a step that the end of the run stopped)."""
    if recorded != "running":
        return recorded
    if run_status == "running" and (summary["by_status"].get("running") or latest):
        return "running"
    return "completed" if summary["completed"] else "cancelled"


def groups(store: Store, kind: str, parent_id: int) -> dict[str, Any] | None:
    """A step's (or eval's, baseline's) rollouts, grouped by GRPO group, each member with its advantage."""
    if kind not in ("steps", "evals", "baselines"):
        raise ValueError(kind)
    table, r, tasks = T[kind], T["rollouts"], T["tasks"]
    with store.engine.connect() as conn:
        found = conn.execute(select(table).where(table.c.id == parent_id)).first()
        if found is None:
            return None
        parent = _row(found)
        link = r.c[f"{kind[:-1]}_id"]
        rollouts = _rows(conn, select(*(r.c[c] for c in _ROLLOUT_COLUMNS), r.c.summary_json,
                                      tasks.c.task_id.label("task_key"), tasks.c.name.label("task_name"))
                         .join(tasks, tasks.c.id == r.c.task_id, isouter=True).where(link == parent_id)
                         .order_by(r.c.group_id, r.c.env_index, r.c.id))
    grouped: dict[str, list[dict]] = defaultdict(list)
    for x in rollouts:
        grouped[x.get("group_id") or f"rollout-{x['id']}"].append(x)
    parent["kind"] = kind
    parent["summary"] = summarise(rollouts)
    parent["groups"] = [{"group_id": g, "task": members[0].get("task_name") or members[0].get("task_key"),
                         "summary": summarise(members), "members": as_tree(members)} for g, members in grouped.items()]
    return parent


def as_tree(members: list[dict]) -> list[dict]:
    """A group's members; a tree group's (cua_rl/workflow/tree.py: their summaries name ``tree_first_turn`` and
    ``tree_parent``, the client id of the rollout each was forked from) depth first, each parent before the paths
    forked from it, with ``tree``: its parent's rollout id (None for a root), the turn it starts at and its depth.
    A member whose summary has not come yet (running) shows as a root."""
    summaries = {m["id"]: _loads(m.pop("summary_json", None)) or {} for m in members}
    if not any("tree_first_turn" in s for s in summaries.values()):
        return members
    by_client = {m.get("client_id"): m for m in members}
    children: dict[int | None, list[dict]] = defaultdict(list)
    for m in members:
        found = by_client.get(summaries[m["id"]].get("tree_parent"))
        m["tree"] = {"parent": found["id"] if found else None,
                     "first_turn": summaries[m["id"]].get("tree_first_turn", 1)}
        children[m["tree"]["parent"]].append(m)
    ordered: list[dict] = []

    def visit(member: dict, depth: int) -> None:
        member["tree"]["depth"] = depth
        ordered.append(member)
        for child in children[member["id"]]:
            visit(child, depth + 1)

    for root in children[None]:
        visit(root, 0)
    return ordered


def rollout(store: Store, rollout_id: int) -> dict[str, Any] | None:
    """One rollout with its task, turns (parsed), actions, validation and its group's members."""
    r, tasks, turns, val, acts = T["rollouts"], T["tasks"], T["turns"], T["validations"], T["actions"]
    with store.engine.connect() as conn:
        found = conn.execute(select(r).where(r.c.id == rollout_id)).first()
        if found is None:
            return None
        out = _row(found)
        out["summary"] = _loads(out.pop("summary_json", None))
        if out.get("task_id") is not None:
            task = conn.execute(select(tasks).where(tasks.c.id == out["task_id"])).first()
            out["task"] = None if task is None else _row(task)
        turn_rows = _rows(conn, select(turns).where(turns.c.rollout_id == rollout_id).order_by(turns.c.turn))
        ids = [t["id"] for t in turn_rows]
        actions = _rows(conn, select(acts).where(acts.c.turn_id.in_(ids)).order_by(acts.c.id)) if ids else []
        out["validations"] = _rows(conn, select(val).where(val.c.rollout_id == rollout_id))
        out["group"] = [] if not out.get("group_id") else _rows(conn, select(
            r.c.id, r.c.env_index, r.c.status, r.c.reward, r.c.advantage, r.c.task_success)
            .where(r.c.group_id == out["group_id"], r.c.project_id == out["project_id"]).order_by(r.c.env_index, r.c.id))
    by_turn: dict[int, list[dict]] = defaultdict(list)
    for a in actions:
        a["action"] = _loads(a.pop("action_json", None))
        by_turn[a["turn_id"]].append(a)
    for t in turn_rows:
        for name in ("model_response", "action_json", "metrics_json", "tokens_json", "model_specific_input_json"):
            t[name.removesuffix("_json")] = _loads(t.pop(name, None))
        trainer = t.pop("trainer_logprobs", None)  # sent by the trainer, kept in the turn's extra
        trainer_version = t.pop("trainer_version", None)
        if trainer is not None and isinstance(t.get("tokens"), dict):
            t["tokens"]["trainer_logprobs"] = trainer
            if trainer_version is not None:
                t["tokens"]["trainer_version"] = trainer_version
        t["actions"] = by_turn.get(t["id"], [])
    out["turns"] = turn_rows
    return out


# ---- a run's rollouts, a page at a time or all at once -------------------------------------------------
PAGE_MAX = 500
EXPORT_COLUMNS = (*_ROLLOUT_COLUMNS, "task_key", "task_name")


def _filtered(training_id: int, *, task: str | None = None, status: str | None = None, source: str | None = None,
              min_reward: float | None = None, max_reward: float | None = None):
    """The rollouts of a run with their task's key and name, filtered: ``task`` (its key or name), ``status``,
    ``source`` (step, eval, baseline), reward bounds (inclusive; a rollout without a reward is left out by any
    bound)."""
    r, tasks = T["rollouts"], T["tasks"]
    query = (select(*(r.c[c] for c in _ROLLOUT_COLUMNS), tasks.c.task_id.label("task_key"),
                    tasks.c.name.label("task_name"))
             .join(tasks, tasks.c.id == r.c.task_id, isouter=True).where(r.c.training_id == training_id))
    if task:
        query = query.where(or_(tasks.c.task_id == task, tasks.c.name == task))
    if status:
        query = query.where(r.c.status == status)
    if source:
        query = query.where(r.c.source_type == source)
    if min_reward is not None:
        query = query.where(r.c.reward >= min_reward)
    if max_reward is not None:
        query = query.where(r.c.reward <= max_reward)
    return query


def training_exists(store: Store, training_id: int) -> bool:
    t = T["trainings"]
    with store.engine.connect() as conn:
        return conn.execute(select(t.c.id).where(t.c.id == training_id)).first() is not None


def rollouts_page(store: Store, training_id: int, *, offset: int = 0, limit: int = 50,
                  **filters: Any) -> dict[str, Any] | None:
    """One page of a run's rollouts, newest first, with the total that matched and what the filters can take
    (the run's tasks, statuses and sources)."""
    t, r, tasks = T["trainings"], T["rollouts"], T["tasks"]
    if not 1 <= limit <= PAGE_MAX or offset < 0:
        raise ValueError(f"limit must be 1..{PAGE_MAX} and offset >= 0")
    query = _filtered(training_id, **filters)
    with store.engine.connect() as conn:
        if conn.execute(select(t.c.id).where(t.c.id == training_id)).first() is None:
            return None
        total = conn.execute(select(func.count()).select_from(query.subquery())).scalar_one()
        rows = _rows(conn, query.order_by(r.c.id.desc()).offset(offset).limit(limit))
        mine = r.c.training_id == training_id
        task_names = conn.execute(select(tasks.c.task_id, tasks.c.name).where(
            tasks.c.id.in_(select(r.c.task_id).where(mine).distinct())).order_by(tasks.c.task_id)).all()
        statuses = conn.execute(select(r.c.status).where(mine).distinct()).scalars().all()
        sources = conn.execute(select(r.c.source_type).where(mine).distinct()).scalars().all()
    return {"total": total, "offset": offset, "limit": limit, "filters": {k: v for k, v in filters.items()
                                                                          if v not in (None, "")},
            "rollouts": rows, "tasks": [{"key": k, "name": n} for k, n in task_names],
            "statuses": sorted(x for x in statuses if x), "sources": sorted(x for x in sources if x)}


def rollouts_export(store: Store, training_id: int, **filters: Any) -> Iterable[dict[str, Any]]:
    """Every rollout of a run that the filters keep, oldest first, ``EXPORT_COLUMNS`` each, read in chunks."""
    r = T["rollouts"]
    with store.engine.connect() as conn:
        result = conn.execution_options(yield_per=1000).execute(_filtered(training_id, **filters).order_by(r.c.id))
        for row in result:
            d = dict(row._mapping)
            yield {c: d.get(c) for c in EXPORT_COLUMNS}
