"""Named MiniWoB++ task lists (``cua-eval --suite miniwob[:SPLIT]``) and each task's chance baseline.

Why named lists: a number on MiniWoB++ means little without the tasks behind it. Published results pick
different subsets, so ``cua-eval`` says which split it played, and it can play the lists others publish:

- ``all``: every page our gym serves (the installed package's ``html/miniwob``, 130 pages);
- ``browsergym-train`` / ``browsergym-test``: BrowserGym's 107 / 18 (its task metadata's ``hidden test``
  category is the test split; miniwob_browsergym.json says where the data comes from);
- ``yardstick-train`` / ``yardstick-heldout``: issue 85's yardstick (external_yardstick_plan.json: trained tasks,
  and the held-out variants of them, candidates until the pilot fixes them); ``yardstick``: both, in one pass
  (what bench/external_yardstick.py reads: held-out seeds of the trained tasks and the held-out tasks).

The chance baseline (``chance``): what a policy with no skill scores on the same instances, read from
miniwob_chance.json, which bench/miniwob_chance.py fills by playing a uniformly random valid target (a random
clickable element of the page's DOM) and a uniformly random point of the task area, with Clopper-Pearson
intervals; a task it has not played has none (``null``), never a guess.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
BROWSERGYM_FILE = HERE / "miniwob_browsergym.json"
PLAN_FILE = HERE / "external_yardstick_plan.json"
CHANCE_FILE = HERE / "miniwob_chance.json"
SPLITS = ("all", "browsergym-train", "browsergym-test", "yardstick", "yardstick-train", "yardstick-heldout")
OBSERVATION_NOTE = ("this gym's agent sees screenshots only (pixels in, clicks and keys out); published MiniWoB++ "
                    "leaderboards (BrowserGym's among them) mostly use text observations (the DOM or accessibility "
                    "tree) and element-level actions, so compare with them by split, knowing that difference")


class SuiteError(ValueError):
    """A suite or split that does not exist, or a list naming a page the gym does not serve."""


@functools.cache
def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def plan() -> dict:
    """Issue 85's yardstick plan (external_yardstick_plan.json)."""
    return _json(PLAN_FILE)


def browsergym_split(name: str) -> list[str]:
    """BrowserGym's ``train`` (107) or ``test`` (18, the ``hidden test`` category) MiniWoB++ tasks, in name order."""
    categories = _json(BROWSERGYM_FILE)["miniwob_category"]
    test = name == "test"
    return sorted(t for t, c in categories.items() if (c == "hidden test") == test)


def parse_suite(text: str) -> tuple[str, str]:
    """``miniwob`` or ``miniwob:SPLIT`` -> ("miniwob", SPLIT); ``all`` when no split is named."""
    suite, _, split = text.partition(":")
    if suite != "miniwob":
        raise SuiteError(f"--suite knows miniwob[:SPLIT], not {text!r}")
    split = split or "all"
    if split not in SPLITS:
        raise SuiteError(f"no MiniWoB++ split {split!r}; the splits: {', '.join(SPLITS)}")
    return suite, split


def split_tasks(split: str, served: list[str] | None = None) -> list[str]:
    """The task names of ``split``; every one must be a page the gym serves (``served``: default the installed
    package's pages), else ``SuiteError`` names the missing ones."""
    if served is None:
        from .miniwob import load_miniwob_tasks

        served = [t.name for t in load_miniwob_tasks().tasks]
    if split == "all":
        return sorted(served)
    if split.startswith("browsergym-"):
        names = browsergym_split(split.removeprefix("browsergym-"))
    elif split == "yardstick-train":
        names = list(plan()["train_tasks"])
    elif split == "yardstick-heldout":
        names = list(plan()["heldout_tasks"])
    elif split == "yardstick":
        names = list(plan()["train_tasks"]) + list(plan()["heldout_tasks"])
    else:
        raise SuiteError(f"no MiniWoB++ split {split!r}; the splits: {', '.join(SPLITS)}")
    missing = sorted(set(names) - set(served))
    if missing:
        raise SuiteError(f"split {split} names pages this gym does not serve: {missing}")
    return names


def describe(split: str) -> str:
    """One line: which list was played, where it comes from, and how it compares with published numbers."""
    where = {
        "all": "every MiniWoB++ page this gym serves (the installed miniwob package's html/miniwob)",
        "browsergym-train": "BrowserGym's train split (107 tasks: its metadata's categories other than 'hidden test')",
        "browsergym-test": "BrowserGym's test split (18 tasks: its metadata's 'hidden test' category)",
        "yardstick": "issue 85's trained tasks (on held-out seeds) and held-out tasks "
                     "(cua_rl/local_gym/external_yardstick_plan.json)",
        "yardstick-train": "issue 85's trained tasks (cua_rl/local_gym/external_yardstick_plan.json)",
        "yardstick-heldout": "issue 85's held-out tasks (cua_rl/local_gym/external_yardstick_plan.json; "
                             f"status: {plan()['status'].split(':')[0]})",
    }[split]
    return f"miniwob:{split}: {where}; {OBSERVATION_NOTE}"


def chance_table() -> dict:
    """miniwob_chance.json: ``{"policies": {...}, "tasks": {name: {policy: rate-with-interval}}}``."""
    return _json(CHANCE_FILE) if CHANCE_FILE.exists() else {"policies": {}, "tasks": {}}


def chance(task: str) -> dict | None:
    """A task's chance baselines (per policy: successes, n, rate, cp95), or None when not measured."""
    return chance_table()["tasks"].get(task)
