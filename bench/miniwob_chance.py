"""The chance baseline of MiniWoB++ tasks, played: what a policy with no skill scores, per task, with its
Clopper-Pearson interval, cached in cua_rl/local_gym/miniwob_chance.json for ``cua-eval --suite miniwob``.

Why played, not guessed: a page's reward decides what counts (a click on the wrong button may end the episode
with -1, a click on empty space may do nothing), so the honest baseline is to play the page. Two policies, each
one click per episode (``--clicks`` more, stopping when the page ends the episode), on the held-out instances
``cua-eval`` plays (curriculum.heldout_seeds), through the gym's HTTP API on real Chromium:

- ``target``: a uniformly random valid target: a visible element whose centre lies on the task area (``#wrap``'s
  box; jQuery UI dialogs live outside ``#wrap`` in the DOM), outside the utterance ``#query`` and the gym's hidden
  HUD, that is interactive (button, input, select, textarea, link, label, an element with a click handler
  attribute or a role/tabindex) or a leaf (no element children); its centre is clicked.
  The number of candidates per instance is kept (``mean_candidates``);
- ``pixel``: a uniformly random point of the task area below the utterance.

A task with no candidates on an instance counts as a failure of ``target`` there. Nothing is analytic: every
rate is a count of played episodes.

    python bench/miniwob_chance.py --split yardstick-train --split yardstick-heldout --episodes 32 [--update]
    python bench/miniwob_chance.py --split all --episodes 32 --update     # every page: 130 x 2 x 32 episodes

``--update`` merges the tasks played into the committed JSON (others kept); without it the JSON is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cua_rl.local_gym.miniwob_solvers import Play  # noqa: E402
from cua_rl.stats import rate_with_interval  # noqa: E402

POLICIES = ("target", "pixel")
# Candidates as screen fractions: interactive elements and leaves with a box, inside #wrap, outside #query.
CANDIDATES_JS = """(() => {
  const wrap = (document.getElementById('wrap') || document.body).getBoundingClientRect();
  const query = document.getElementById('query');
  const skip = ['reward-display', 'sync-task-cover', 'click-canvas'].map(id => document.getElementById(id));
  const interactive = 'button, input, select, textarea, a, label, [onclick], [role], [tabindex], .alink';
  const out = [];
  for (const e of document.body.querySelectorAll('*')) {
    if ((query && query.contains(e)) || skip.some(s => s && s.contains(e))) continue;
    const r = e.getBoundingClientRect();
    const style = getComputedStyle(e);
    if (r.width < 1 || r.height < 1 || style.visibility === 'hidden' || style.display === 'none') continue;
    if (!(e.matches(interactive) || e.children.length === 0)) continue;
    const x = r.left + r.width / 2, y = r.top + r.height / 2;   /* on the task area (a dialog lives in body) */
    if (x < wrap.left || x > wrap.right || y < wrap.top || y > wrap.bottom) continue;
    out.push([x / screen.width, y / screen.height]);
  }
  return out;
})()"""
AREA_JS = """(() => { const w = (document.getElementById('wrap') || document.body).getBoundingClientRect();
  const q = document.getElementById('query'); const top = q ? q.getBoundingClientRect().bottom : w.top;
  return [w.left / screen.width, top / screen.height, w.right / screen.width, w.bottom / screen.height]; })()"""


async def _ended(client, eid: str, tries: int = 10) -> dict:
    """The evaluation once the page says the episode is done (animations may end it a moment late), or the last."""
    for _ in range(tries):
        result = await client.evaluate(eid)
        if result.raw["result"]["miniwob"]["done"]:
            return result.raw
        await asyncio.sleep(0.03)
    return result.raw


async def play_one(client, gym, task: str, seed: int, policy: str, clicks: int = 1) -> tuple[bool, int]:
    """One episode of ``policy`` on ``task`` at ``seed``: (success, candidates seen on the first screen)."""
    rng = random.Random(f"chance:{policy}:{task}:{seed}")
    async with client.execution(task, {"seed": seed}) as ex:
        play = Play(client, ex.execution_id, gym.manager.executions[ex.execution_id].desktop, ex.instruction)
        seen = 0
        for i in range(clicks):
            if policy == "target":
                candidates = await play.js(CANDIDATES_JS)
                seen = seen if i else len(candidates)
                if not candidates:
                    break
                x, y = rng.choice(candidates)
            else:
                left, top, right, bottom = await play.js(AREA_JS)
                x, y = rng.uniform(left, right), rng.uniform(top, bottom)
            await play.act({"type": "click", "x": min(max(x, 0.0), 1.0), "y": min(max(y, 0.0), 1.0)})
            result = await _ended(client, ex.execution_id, tries=10 if i == clicks - 1 else 2)
            if result["result"]["miniwob"]["done"]:
                break
        return bool(result["success"]) if seen or policy == "pixel" else False, seen


async def measure(gym, tasks: list[str], episodes: int, clicks: int = 1) -> dict:
    """Every task x policy x held-out seed, one at a time: ``{task: {policy: rate-with-interval + candidates}}``."""
    from cua_rl.genv import GenvClient
    from cua_rl.local_gym.curriculum import heldout_seeds

    out: dict[str, dict] = {}
    async with GenvClient(gym.url, gym.gym_id) as client:
        for task in tasks:
            out[task] = {}
            for policy in POLICIES:
                wins, seen = 0, []
                for seed in heldout_seeds(episodes):
                    ok, n = await play_one(client, gym, task, seed, policy, clicks)
                    wins += ok
                    seen.append(n)
                row = rate_with_interval(wins, episodes)
                if policy == "target":
                    row["mean_candidates"] = round(sum(seen) / len(seen), 2)
                out[task][policy] = row
            print(json.dumps({"task": task, **out[task]}), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    from cua_rl.local_gym import start_gym_server
    from cua_rl.local_gym.miniwob_suites import CHANCE_FILE, split_tasks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", action="append", default=[], help="a cua-eval split (repeatable; default all)")
    ap.add_argument("--task", action="append", default=[], help="a task name (repeatable)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--clicks", type=int, default=1, help="clicks per episode at most (stops when the page ends it)")
    ap.add_argument("--update", action="store_true", help=f"merge into {CHANCE_FILE.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    tasks = list(dict.fromkeys(args.task + [t for s in (args.split or ([] if args.task else ["all"]))
                                            for t in split_tasks(s)]))
    t0 = time.monotonic()
    with start_gym_server(port=0, gym_id="miniwob", pool_size=1, max_executions=2) as gym:
        measured = asyncio.run(measure(gym, tasks, args.episodes, args.clicks))
    table = json.loads(CHANCE_FILE.read_text()) if CHANCE_FILE.exists() else {}
    table.update({
        "_what": "MiniWoB++ chance baselines, played (bench/miniwob_chance.py's docstring): per task and policy, "
                 "successes of n episodes on the held-out seeds with the two-sided 95% Clopper-Pearson interval",
        "policies": {"target": "one click on a uniformly random valid target (a visible interactive or leaf element "
                               "of the task area outside the utterance)",
                     "pixel": "one click on a uniformly random point of the task area below the utterance"},
        "clicks_per_episode": args.clicks})
    table.setdefault("tasks", {}).update(measured)
    table["tasks"] = dict(sorted(table["tasks"].items()))
    print(f"{len(tasks)} task(s) x {len(POLICIES)} policies x {args.episodes} episodes in "
          f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    if args.update:
        CHANCE_FILE.write_text(json.dumps(table, indent=1) + "\n")
    else:
        print(json.dumps(table, indent=1))
    return table


if __name__ == "__main__":
    main()
