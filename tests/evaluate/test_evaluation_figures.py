"""The held-out figures of ``cua_rl.evaluate`` and the learning bench's statistics, on constructed episodes:
success per regime and per slice (the confused colours where the warm start's demonstrator slips, and the
rest), pass@K over K samples per instance, mean turns, the per-instance outcomes two checkpoints are compared
by with their regime and content unit; the cluster bootstrap over content units (it must contain 0 for a
checkpoint no better than the warm start, exclude 0 for one better on most units, and be wider than an
instance bootstrap when instances repeat a unit); the gate's verdict on constructed runs, each way of failing
named; the interval across seeds."""

import json
from pathlib import Path

import pytest

from cua_rl.evaluate import Episode, summarize
from cua_rl.local_gym.curriculum import make_instance, seeds, slices
from tests.benches import bench_module

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return bench_module("learning_bench")


def test_regimes_slices_pass_at_k_turns_and_outcomes():
    yellow = next(s for s in seeds("heldout", 50) if slices(make_instance("key-sequence", s)) == ("yellow",))
    rest = next(s for s in seeds("heldout-content", 50) if slices(make_instance("key-sequence", s)) == ("rest",))
    episodes = [Episode("054", "key-sequence", yellow, False, 6, "instances"),
                Episode("054", "key-sequence", yellow, True, 4, "instances"),
                Episode("054", "key-sequence", rest, False, 6, "content"),
                Episode("054", "key-sequence", rest, False, 6, "content")]
    result = summarize("ckpt", episodes, dropped=0, model_errors=0, seconds=1.0, greedy=False, samples=2)
    assert result.success == 0.25 and result.slices == {"rest": 0.0, "yellow": 0.5}
    assert result.regimes == {"content": {"success": 0.0, "episodes": 2, "slices": {"rest": 0.0}},
                              "instances": {"success": 0.5, "episodes": 2, "slices": {"yellow": 0.5}}}
    assert result.pass_at_k == 0.5 and result.mean_turns == 5.5 and result.episodes == 4
    units = {s: make_instance("key-sequence", s).content for s in (yellow, rest)}
    assert result.outcomes == sorted([["054", yellow, 1, "instances", units[yellow]],
                                      ["054", rest, 0, "content", units[rest]]])
    once = summarize("ckpt", episodes[:1], 0, 0, 1.0, greedy=True, samples=1)
    assert once.pass_at_k is None and once.greedy


def _outcomes(successes: list[int], units: int, regime: str = "content") -> list[list]:
    """Instances ``i`` of content unit ``i % units`` with the given successes."""
    return [["054", i, s, regime, f"unit{i % units}"] for i, s in enumerate(successes)]


def test_the_cluster_bootstrap_counts_content_units_not_instances():
    bench = _bench()
    before = _outcomes([i % 2 for i in range(120)], 40)                 # half solved
    same = [list(o) for o in before]
    better = _outcomes([1 if i % 10 else 0 for i in range(120)], 40)    # every earlier success kept, more added
    flat = bench.cluster_rise(before, [same, same], "content")
    assert flat["rise"] == 0.0 and flat["ci95"][0] <= 0.0 <= flat["ci95"][1] and flat["units"] == 40
    up = bench.cluster_rise(before, [better], "content")
    assert up["rise"] == 0.4 and up["ci95"][0] > 0.2 and up["instances"] == 120
    assert bench.cluster_rise(before, [better, same], "content")["rise"] == 0.2   # the mean over two RL seeds
    # Three instances repeat each unit and the rise comes whole units at a time (as greedy decoding does): the
    # cluster interval is wider than the instance bootstrap's, which counts 120 independent draws where there are 40.
    lumpy = _outcomes([1 if (i % 40) % 3 == 0 else 0 for i in range(120)], 40)
    base = _outcomes([0] * 120, 40)
    cluster = bench.cluster_rise(base, [lumpy], "content")["ci95"]
    instance = bench.paired_rise(base, [lumpy])["ci95"]
    assert cluster[1] - cluster[0] > 1.4 * (instance[1] - instance[0]), (cluster, instance)
    with pytest.raises(ValueError):
        bench.cluster_rise(before, [better], "instances")             # no instance of that regime
    with pytest.raises(ValueError):
        bench.cluster_rise(before, [_outcomes([1] * 120, 40)[1:] + _outcomes([1], 1)], "content")


def _gate(yellow: tuple, cyan: tuple, rest: tuple, rises: dict | None = None) -> dict:
    rises = rises or {r: {"rise": 0.4, "ci95": [0.3, 0.5], "units": 36, "instances": 64} for r in ("instances", "content")}
    return {"rises": rises, "slices": {"yellow": dict(zip(("before", "after"), yellow)),
                                       "cyan": dict(zip(("before", "after"), cyan)),
                                       "rest": dict(zip(("before", "after"), rest))}}


def test_the_gate_passes_a_learning_run_and_names_each_way_a_run_fails_it():
    """bench.gate_failures, CI's gate and the bench's verdict on every run: a run that flips both biased slices
    passes; each figure a wrong run shows is named (the bar: the bench's docstring, THE BAR)."""
    bench = _bench()
    record = {"rollout_success": [.59, .69, .5, .75, .69, .63, .69, .5, .56, .75, .31, .5, .5, .69, .63, None],
              "served_versions": list(range(1, 16))}
    good = _gate((0.15, 0.9), (0.2, 0.85), (0.98, 0.97))
    assert bench.gate_failures(good, record, 16, 1) == []
    assert bench.gate_statistic(good) == 0.65
    wrong = [
        _gate((0.15, 0.9), (0.2, 0.85), (0.98, 0.97), {"instances": {"rise": 0.4, "ci95": [0.3, 0.5], "units": 36},
                                                       "content": {"rise": -0.05, "ci95": [-0.12, -0.01], "units": 36}}),
        _gate((0.15, 0.9), (0.2, 0.85), (0.98, 0.97), {"instances": {"rise": 0.2, "ci95": [-0.01, 0.4], "units": 36},
                                                       "content": {"rise": 0.4, "ci95": [0.3, 0.5], "units": 36}}),
        _gate((0.15, 0.9), (0.2, 0.3), (0.98, 0.97)),     # one slice flipped, the other not: a control's luck
        _gate((0.15, 0.9), (0.2, 0.85), (0.98, 0.7)),     # the loss mask a token late (the rest fell)
    ]
    for gate in wrong:
        [why] = bench.gate_failures(gate, record, 16, 1)
        assert why.split()[0] in ("held-out", "biased", "the"), why
    collapsed = {**record, "rollout_success": [.7] * 5 + [.2] * 10 + [None]}
    assert bench.gate_failures(good, collapsed, 16, 1)[0].startswith("sampled success fell")
    stale = {**record, "served_versions": []}                  # updates that never reached vLLM
    assert bench.gate_failures(good, stale, 16, 1)[0].startswith("vLLM loaded")
    holes = {**record, "rollout_success": [*record["rollout_success"][:7], None, *record["rollout_success"][8:]]}
    assert len(bench.gate_failures(good, holes, 16, 1)) == 1   # a version with no episode
    assert bench.gate_statistic(_gate((0.15, 0.9), (0.2, 0.3), (0.98, 0.97))) == 0.1


def test_the_interval_across_seeds():
    bench = _bench()
    assert bench.welch([0.5], [0.9, 0.8]) is None                      # one seed: no interval
    low, high = bench.welch([0.5, 0.55, 0.45], [0.9, 0.85, 0.95])
    assert low < 0.4 < high and low > 0.2
    low, high = bench.welch([0.5, 0.9, 0.1], [0.55, 0.95, 0.15])        # seeds vary more than the methods differ
    assert low < 0 < high
    assert bench.across_seeds([0.3, 0.35, 0.25])[0] > 0.1


def test_a_method_comparison_says_whether_the_target_was_met():
    """Issue 65's target: the method reaches GRPO's final held-out success in every gated regime with at most
    60% of GRPO's environment steps; each way of missing it is named."""
    bench = _bench()

    def compared(tree_success: float, tree_env: float) -> dict:
        regimes = {r: {"grpo": 0.9, "tree": tree_success} for r in bench.GATED}
        return {"regimes": regimes, "env_steps": {"grpo": 1000.0, "tree": tree_env}}

    assert bench.comparison_target("grpo", "tree", compared(0.9, 600.0)) == \
        {"env_steps_share": 0.6, "at_most": 0.6, "met": True, "why_not": []}
    more_steps = bench.comparison_target("grpo", "tree", compared(0.95, 700.0))
    assert not more_steps["met"] and more_steps["why_not"] == ["tree used 0.7 of grpo's environment steps (> 0.6)"]
    worse = bench.comparison_target("grpo", "tree", compared(0.8, 500.0))
    assert not worse["met"] and len(worse["why_not"]) == len(bench.GATED), worse
    assert not bench.comparison_target("grpo", "tree", compared(0.9, None))["met"]   # no count: not met


def test_a_method_comparison_keeps_each_seeds_success_and_environment_steps():
    """Issue 90: besides the means, ``method_comparison`` keeps per gated regime each run's held-out greedy success
    (``per_seed``) and each run's environment steps (``env_steps_per_run``, replayed actions counted)."""
    bench = _bench()
    runs = {"grpo": ["grpo-s1", "grpo-s2"], "tree": ["tree-s1", "tree-s2", "tree-s3"]}
    success = {"grpo-s1": 0.9, "grpo-s2": 0.8, "tree-s1": 0.7, "tree-s2": 0.9, "tree-s3": 1.0}
    per = {label: {"greedy": {"regimes": {r: {"success": s} for r in bench.GATED}}} for label, s in success.items()}
    use = {label: {"env_steps": 100 * (i + 1), "desktop_seconds": 1.0, "trained_tokens": 10}
           for i, label in enumerate(success)}
    before = {"regimes": {r: {"success": 0.5} for r in bench.GATED}}
    out = bench.method_comparison("grpo", runs["grpo"], "tree", runs["tree"], per, before,
                                  {r: {"gated": True} for r in bench.GATED}, use,
                                  {label: 16 if label.startswith("grpo") else 9 for label in success})
    for r in bench.GATED:
        assert out["regimes"][r]["per_seed"] == {"grpo": [0.9, 0.8], "tree": [0.7, 0.9, 1.0]}
        assert out["regimes"][r]["grpo"] == 0.85 and out["regimes"][r]["tree"] == 0.8667
    assert out["env_steps_per_run"] == {"grpo": [100, 200], "tree": [300, 400, 500]}
    assert out["env_steps"] == {"grpo": 150.0, "tree": 400.0} and not out["target"]["met"]


def test_the_calibrations_bounds_and_fit():
    """bench/gate_calibration.py: Clopper-Pearson bounds (0 of 8 -> 1 - 0.025^(1/8); 5 of 5 -> 0.025^(1/5); 3 of
    10 -> the textbook [0.0667, 0.6525]) and the normal fit of the controls' gate statistic."""
    cal = bench_module("gate_calibration")
    assert cal.clopper_pearson(0, 8) == (0.0, round(1 - 0.025 ** (1 / 8), 4))
    assert cal.clopper_pearson(5, 5) == (round(0.025 ** (1 / 5), 4), 1.0)
    assert cal.clopper_pearson(3, 10) == (0.0667, 0.6525)
    assert cal.normal_tail([0.0], 0.25) is None
    assert cal.normal_tail([0.0, 0.1, -0.05, 0.3, 0.05], 0.25) == pytest.approx(0.104, abs=1e-3)
    gate = _gate((0.15, 0.9), (0.2, 0.3), (0.98, 0.97))
    run = {"gate": gate, "gate_failures": ["biased slice cyan"], "regimes": {}, "rollout_success": [],
           "served_versions": []}
    result = {"seeds": [{**run, "seed": 1, "gate": _gate((0.1, 0.9), (0.1, 0.9), (1, 1)), "gate_failures": []}],
              "controls": {"shuffled_rewards": {**run, "seeds": [{**run, "seed": 1}, {**run, "seed": 2}]}}}
    records = cal.seed_records(result, "x.json")
    summary = cal.summarize(records, 0.25)
    assert summary["null"]["runs"] == 2 and summary["null"]["passed"] == 0 and summary["power"]["passed"] == 1
    assert summary["null"]["gate_statistic"] == [0.1, 0.1] and summary["power"]["gate_statistic"] == [0.8]
    # the evidence is the count and its exact bound; the normal fit sits beside it, named as a model
    assert summary["null"]["evidence"].startswith("0 of 2 shuffled-reward controls passed")
    assert "p_pass_fit" not in summary["null"] and "a model" in summary["null"]["normal_fit_model"]["what"]
    # the committed calibration of CI's task says 0 of 8, bound 0.37, with the fit's failure on the earlier tasks
    committed = json.loads((ROOT / "docs/bench/calibration/drill-task/summary.json").read_text())["calibration"]
    assert committed["null"]["evidence"].startswith("0 of 8") and committed["null"]["cp95_upper"] == 0.3694
    earlier = {e["task"]: e for e in committed["normal_fit_on_earlier_tasks"]}
    assert earlier["flailing-demonstrator"]["passed"] == 2 and earlier["flailing-demonstrator"]["at_or_above_bar"] == 3
    # a bench run of one control seed (--first-control-seed 7) names its seed; one that does not is refused
    single = cal.seed_records({"controls": {"shuffled_rewards": {**run, "seed": 7}}}, "y.json")
    assert [(r["kind"], r["seed"]) for r in single] == [("control", 7)]
    with pytest.raises(SystemExit, match="without its seed"):
        cal.seed_records({"controls": {"shuffled_rewards": run}}, "z.json")
    # --run-logs finds each seed's run by the bench's own names (a control's first seed has no suffix)
    assert [cal.run_label(k, s) for k, s in (("grpo", 1), ("control", 1), ("control", 3))] == \
        ["grpo-s1", "shuffled_rewards", "shuffled_rewards-s3"]


def test_the_slice_walk_reads_the_decision_at_the_confused_square(tmp_path):
    """bench/slice_walk.py on a constructed run store: per step, the decisions at the yellow square of episodes
    that reached it (an episode lost before it is not one), the right ones, the estimate of p(right key) from the
    recorded logprob of the pressed key's token (p when right, 1 - p when wrong) and the mixed groups."""
    import json
    import math

    from sqlalchemy import insert

    from cua_rl.monitor.schema import TABLES, projects
    from cua_rl.monitor.store import Store, sqlite_url

    walk = bench_module("slice_walk")
    seed = next(s for s in seeds("train", 200)
                if make_instance("key-sequence", s).content.split("-")[0] == "yellow")
    other = next(s for s in seeds("train", 200) if slices(make_instance("key-sequence", s)) == ("rest",))
    drill = next(s for s in seeds("train", 200)
                 if make_instance("key-sequence-drill", s).content.split("-")[0] == "yellow"
                 and make_instance("key-sequence", s).content.split("-")[0] != "yellow")
    solution = [step["keys"][0] for step in make_instance("key-sequence", seed).solution]
    drill_key = make_instance("key-sequence-drill", drill).solution[0]["keys"][0]
    log_dir = tmp_path / "run"
    (log_dir / "monitor").mkdir(parents=True)
    store = Store.open(sqlite_url(log_dir / "monitor" / "monitor.db"))

    def reply(key, p):
        return {"action_json": json.dumps({"type": "key", "keys": [key]}),
                "tokens_json": json.dumps({"pieces": ["{\"", "keys", "\": [\"", key, "\"]"],
                                           "logprobs": [0.0, 0.0, 0.0, math.log(p), 0.0]})}

    with store.engine.begin() as conn:
        conn.execute(insert(projects).values(id=1, name="p", created_at="now"))
        for task, (task_id, name) in enumerate([("054-key-sequence", "key-sequence"),
                                                 ("056-key-sequence-drill", "key-sequence-drill")], 1):
            conn.execute(insert(TABLES["tasks"]).values(id=task, project_id=1, client_id=f"t{task}",
                                                        task_id=task_id, name=name))
        conn.execute(insert(TABLES["steps"]).values(id=1, project_id=1, client_id="s0", step=0))
        conn.execute(insert(TABLES["steps"]).values(id=2, project_id=1, client_id="s1", step=1))
        plays = [(1, "g1", seed, 1.0, [reply(solution[0], 0.4)]),       # right at yellow, p 0.4
                 (1, "g1", seed, 0.0, [reply("r", 0.75)]),              # wrong: estimate 1 - 0.75
                 (1, "g2", other, 1.0, [reply("x", 0.5)]),              # no yellow: not counted
                 (2, "g3", seed, 0.0, [reply("r", 0.9)]),
                 (2, "g3", seed, 0.0, [reply("r", 0.9)]),
                 (2, "g4", drill, 1.0, [reply(drill_key, 0.8)])]         # the drill's instance of its seed
        for i, (step_id, group, s, reward, turns) in enumerate(plays, 1):
            conn.execute(insert(TABLES["rollouts"]).values(
                id=i, project_id=1, client_id=f"r{i}", step_id=step_id, is_eval=False, group_id=group,
                task_id=2 if group == "g4" else 1,
                reward=reward, summary_json=json.dumps({"seed": s})))
            for t, turn in enumerate(turns, 1):
                conn.execute(insert(TABLES["turns"]).values(project_id=1, client_id=f"r{i}t{t}", rollout_id=i,
                                                            turn=t, **turn))
    store.close()
    result = walk.walk(log_dir)
    assert [(s["step"], s["decisions"], s["right"], s["p_right"], s["groups"], s["mixed_groups"])
            for s in result["steps"]] == [(0, 2, 1, 0.325, 1, 1), (1, 3, 1, 0.333, 2, 0)]
    assert result["mixed_groups"] == 1 and result["first"] == round((0.4 + 0.25 + 0.1 + 0.1 + 0.8) / 5, 3)
    with pytest.raises(SystemExit, match="no monitor store"):
        walk.walk(tmp_path / "nowhere")
