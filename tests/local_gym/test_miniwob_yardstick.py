"""Issue 85's MiniWoB++ yardstick, without a browser: the named task lists ``cua-eval --suite`` plays, the committed
plan (disjoint lists, the issue's minimums, pages the gym serves), the exact permutation test on hand-computed
examples, the bar's judgement and the result JSON's schema, the suite report's Clopper-Pearson intervals with the
chance baseline beside each task, and the committed chance table's counts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from cua_rl.local_gym import miniwob_suites as suites
from cua_rl.stats import clopper_pearson
from tests.benches import bench_module

ROOT = Path(__file__).resolve().parents[2]


yardstick = bench_module("external_yardstick")


def test_the_named_lists_are_browsergyms_split_and_the_plans_and_every_page_is_served():
    assert len(suites.split_tasks("all")) == 130
    train, test = suites.split_tasks("browsergym-train"), suites.split_tasks("browsergym-test")
    assert (len(train), len(test)) == (107, 18) and not set(train) & set(test)
    assert {"click-test", "click-dialog"} <= set(train) and {"sign-agreement", "stock-market"} <= set(test)
    plan = suites.plan()
    assert suites.split_tasks("yardstick") == plan["train_tasks"] + plan["heldout_tasks"]
    assert yardstick.check_plan(plan) == []
    # a page the gym does not serve, and a split or suite that does not exist, are refused by name
    with pytest.raises(suites.SuiteError, match="click-test-2"):
        suites.split_tasks("yardstick-train", served=["click-test"])
    with pytest.raises(suites.SuiteError, match="no MiniWoB\\+\\+ split 'hidden'"):
        suites.parse_suite("miniwob:hidden")
    with pytest.raises(suites.SuiteError, match="knows miniwob"):
        suites.parse_suite("webarena")
    assert suites.parse_suite("miniwob") == ("miniwob", "all")
    about = suites.describe("browsergym-test")
    assert "BrowserGym's test split" in about and "text observations" in about


def test_the_plan_check_catches_what_the_issue_forbids():
    plan = suites.plan()
    overlap = {**plan, "heldout_tasks": plan["heldout_tasks"][:2] + [plan["train_tasks"][0]]}
    problems = yardstick.check_plan(overlap)
    assert any("overlap" in p for p in problems) and len(problems) == 1
    few = {**plan, "seeds": {**plan["seeds"], "control": 3}, "instances_per_heldout_task": 16}
    assert len(yardstick.check_plan(few)) == 2
    assert plan["bar"]["permutation_p_max"] == 0.05 and plan["bar"]["grpo_mean_heldout_task_rise_min"] == 0.10
    assert plan["bar"]["grpo_mean_heldout_seed_rise_min"] == 0.15 and plan["bar"]["decided"] is None
    # Fixed before any seed ran: the pilot may only have dropped candidates committed before it (never added one)
    assert plan["status"].startswith("fixed") and plan["pilot"]["scores"].keys() >= set(plan["heldout_tasks"])
    assert set(plan["heldout_tasks"]) <= {"click-test-transfer", "focus-text-2", "click-dialog-2", "click-tab-2"}


def test_the_exact_permutation_p_on_hand_computed_examples():
    # runs .3 .2 | .0 .1: the 6 relabellings give GRPO-minus-control .2 (observed), 0, .1, -.1, 0, -.2 -> 1 of 6
    assert yardstick.exact_permutation_p([0.3, 0.2], [0.0, 0.1]) == pytest.approx(1 / 6)
    # ties count as at least as extreme: 1 1 | 1 0 -> three labellings reach the observed +0.5 -> 3 of 6
    assert yardstick.exact_permutation_p([1.0, 1.0], [1.0, 0.0]) == pytest.approx(3 / 6)
    # the worst case: the observed labelling is the lowest of all -> every relabelling counts
    assert yardstick.exact_permutation_p([0.0], [1.0, 2.0]) == 1.0
    # 5 + 5 runs, fully separated: only the observed labelling of C(10, 5) = 252 reaches it
    assert yardstick.exact_permutation_p([0.5, 0.4, 0.45, 0.6, 0.3], [0.0, 0.1, -0.1, 0.05, 0.0]) == \
        pytest.approx(1 / 252)
    # equal runs everywhere: all 252 tie -> p = 1
    assert yardstick.exact_permutation_p([0.2] * 5, [0.2] * 5) == 1.0


def _run(plan: dict, seed: int, heldout_after: int, seeds_after: int, n: int = 4) -> dict:
    """A run whose every held-out-task instance goes 0 -> ``heldout_after`` and every held-out seed of a trained
    task 0 -> ``seeds_after``."""
    return {"seed": seed, "warm_start": "w",
            "heldout_tasks": [{"task": t, "seed": s, "before": 0, "after": heldout_after}
                              for t in plan["heldout_tasks"] for s in range(n)],
            "heldout_seeds": [{"task": t, "seed": s, "before": 0, "after": seeds_after}
                              for t in plan["train_tasks"] for s in range(n)]}


def test_the_bar_and_the_result_json_in_the_issues_schema():
    plan = suites.plan()
    grpo = [_run(plan, s, 1, 1) for s in range(1, 6)]
    control = [_run(plan, s, 0, 0) for s in range(1, 6)]
    doc = yardstick.document(plan, grpo, control, warm_start="abc", decided="0123abc",
                             cross_check={"agree": 50, "of": 50})
    assert yardstick.validate(doc) == []
    y, verdict = doc["external_yardstick"], doc["verdict"]
    assert y["suite"] == "miniwob" and y["bar"]["decided"] == "0123abc" and y["warm_start"] == "abc"
    assert set(y["chance"]) == set(plan["train_tasks"] + plan["heldout_tasks"])
    assert verdict["met"] and verdict["statistic"] == 1.0 and y["permutation_p"] == pytest.approx(1 / 252, abs=1e-6)
    # GRPO no better than the controls on held-out tasks: p = 1, the rise bar fails, and the JSON says why
    flat = yardstick.judge([_run(plan, s, 0, 1) for s in range(1, 6)], control, plan)
    assert not flat["met"] and flat["permutation_p"] == 1.0
    assert any("held-out-task rise" in w for w in flat["why_not"]) and any("permutation p" in w for w in flat["why_not"])
    # too few runs is named too; a row that is no 0/1 outcome and an undecided bar are schema errors
    assert any("the plan asks for" in w for w in yardstick.judge(grpo[:3], control[:3], plan)["why_not"])
    assert y["complete"] and not yardstick.document(plan, grpo[:2], control[:2], warm_start="abc", decided="0123abc",
                                                    cross_check=None)["external_yardstick"]["complete"]
    bad = copy.deepcopy(doc)
    bad["external_yardstick"]["bar"]["decided"] = ""
    bad["external_yardstick"]["grpo"][0]["heldout_tasks"][0]["before"] = 0.5
    problems = yardstick.validate(bad)
    assert any("decided" in p for p in problems) and any("bad heldout_tasks row" in p for p in problems)


def test_a_mutation_is_seen_only_below_every_grpo_run_of_a_yardstick_that_met_its_bar():
    """Item 7's rule (``MUTATION_RULE``, fixed before any mutation run ended): one mutation run is seen when its
    held-out-task rise is below every GRPO run's and GRPO learned measurably; a yardstick whose GRPO did not learn
    sees no mutation, however low it lands."""
    plan = suites.plan()
    grpo = [_run(plan, s, 1, 1) for s in range(1, 6)]
    control = [_run(plan, s, 0, 0) for s in range(1, 6)]
    learned = yardstick.judge(grpo, control, plan)
    broken, harmless = _run(plan, 1, 0, 0), _run(plan, 1, 1, 1)
    seen, unseen = yardstick.judge_mutations([("shift_loss_mask", broken), ("batch_recentring", harmless)],
                                             learned, plan)
    assert seen["seen"] and seen["grpo_runs_above"] == 5 and seen["controls_above"] == 0
    assert not unseen["seen"] and unseen["grpo_runs_above"] == 0 and unseen["heldout_task_rise"] == 1.0
    flat = yardstick.judge([_run(plan, s, 0, 1) for s in range(1, 6)], control, plan)
    falls = _run(plan, 1, 0, 0)
    for row in falls["heldout_tasks"]:
        row["before"] = 1   # 1 -> 0 on every held-out instance: below every GRPO run of the flat yardstick
    [low] = yardstick.judge_mutations([("shift_loss_mask", falls)], flat, plan)
    assert not flat["met"] and low["grpo_runs_above"] == 5 and not low["seen"]


def test_the_pilot_keeps_the_candidates_the_warm_start_scores_between_0_1_and_0_7():
    plan = suites.plan()
    a, b, c, d = plan["heldout_tasks"]
    scores = {a: 1, b: 3, c: 7, d: 10}   # successes of 10: 0.1 and 0.7 are kept (inclusive), 0.3 too, 1.0 not
    warm = {"outcomes": [[t, s, int(s < k), "", ""] for t, k in scores.items() for s in range(10)]}
    choice = yardstick.pilot(warm, plan)
    assert choice["keep"] == [a, b, c] and choice["drop"] == [d] and choice["enough"]
    assert choice["scores"] == {a: 0.1, b: 0.3, c: 0.7, d: 1.0}


def test_rows_pair_the_same_instances_before_and_after():
    plan = suites.plan()
    t = plan["heldout_tasks"][0]
    before = {"outcomes": [[t, 5, 0, "", "x"], [t, 6, 1, "", "y"], ["other", 1, 1, "", "z"]]}
    after = {"outcomes": [[t, 5, 1, "", "x"], [t, 6, 1, "", "y"], ["other", 1, 0, "", "z"]]}
    assert yardstick.rows_from_eval(before, after, [t]) == [
        {"task": t, "seed": 5, "before": 0, "after": 1}, {"task": t, "seed": 6, "before": 1, "after": 1}]
    with pytest.raises(ValueError, match="different instances"):
        yardstick.rows_from_eval(before, {"outcomes": [[t, 5, 1, "", "x"]]}, [t])


def test_the_suite_report_gives_each_task_its_interval_and_chance():
    from cua_rl.evaluate import CheckpointResult, suite_report

    outcomes = [["click-test", s, 1, "", ""] for s in range(8)] + [["focus-text-2", s, int(s < 3), "", ""]
                                                                  for s in range(8)]
    result = CheckpointResult(checkpoint="ck", success=0.6875, greedy=True, outcomes=outcomes)
    report = suite_report(result, "yardstick", ["click-test", "focus-text-2"])
    assert report["split"] == "yardstick" and "text observations" in report["about"] and report["decoding"] == "greedy"
    assert report["per_task"]["focus-text-2"]["cp95"] == list(clopper_pearson(3, 8))
    assert report["per_task"]["click-test"] | {"chance": None} == {"successes": 8, "n": 8, "rate": 1.0,
                                                                  "cp95": [0.6306, 1.0], "chance": None}
    assert report["overall"]["successes"] == 11 and report["overall"]["n"] == 16
    assert report["per_task"]["click-test"]["chance"]["target"]["n"] >= 8   # the committed table's


def test_the_committed_chance_table_covers_the_yardstick_with_exact_intervals():
    table = suites.chance_table()
    assert set(suites.split_tasks("yardstick")) <= set(table["tasks"])
    for task, policies in table["tasks"].items():
        for policy in ("target", "pixel"):
            row = policies[policy]
            assert row["cp95"] == list(clopper_pearson(row["successes"], row["n"])), (task, policy)
    # a one-button page: any valid target wins; the same page clicked at random points mostly misses
    assert table["tasks"]["click-test"]["target"]["rate"] == 1.0 > table["tasks"]["click-test"]["pixel"]["rate"]


def test_cua_eval_suite_rows_are_the_splits_tasks_on_the_gym_it_talks_to(tmp_path):
    """``cua-eval --suite``'s task rows come from the gym it plays on (its task list over HTTP), in the split's
    order, pointed at that gym; a gym that lacks a page of the split is refused by name. No browser starts: the
    gym is asked for its task list only."""
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig
    from cua_rl.evaluate import suite_rows
    from cua_rl.local_gym import start_gym_server

    with start_gym_server(port=0, gym_id="miniwob", pool_size=0, max_executions=1) as gym:
        config, _ = load_expr_config(["--config", str(ROOT / "examples/cua_agent/config.cpu.yaml"),
                                      f"cluster.fileroot={tmp_path}", f"gym_base_url={gym.url}", "gym_id=miniwob"],
                                     CUAConfig)
        names, rows = suite_rows(config, "yardstick-heldout")
    assert names == suites.plan()["heldout_tasks"] == [r["task_id"] for r in rows]
    assert {r["gym_base_url"] for r in rows} == {gym.url} and {r["gym_id"] for r in rows} == {"miniwob"}
    assert rows[0]["instruction"]   # the gym's own description of the task
    with pytest.raises(suites.SuiteError, match="does not serve"):
        suites.split_tasks("browsergym-test", served=names)
