"""The held-out figures of ``cua_rl.evaluate`` and the learning bench's paired rise, on constructed episodes:
success per slice (the instances where the warm start's demonstrator slips, and the rest), pass@K over K
samples per instance, mean turns, the per-instance outcomes two checkpoints are compared by, and the
paired bootstrap interval (it must contain 0 for a checkpoint no better than the warm start and exclude 0
for one that is better on most instances)."""

import importlib.util
from pathlib import Path

import pytest

from cua_rl.evaluate import Episode, summarize
from cua_rl.local_gym.curriculum import make_instance, wrong_solutions

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "bench" / "learning_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slices_pass_at_k_turns_and_outcomes():
    slip = next(s for s in range(50) if wrong_solutions(make_instance("key-sequence", s)))
    clean = next(s for s in range(50) if not wrong_solutions(make_instance("key-sequence", s)))
    episodes = [Episode("054", "key-sequence", slip, False, 6), Episode("054", "key-sequence", slip, True, 4),
                Episode("054", "key-sequence", clean, False, 6), Episode("054", "key-sequence", clean, False, 6)]
    result = summarize("ckpt", episodes, dropped=0, model_errors=0, seconds=1.0, greedy=False, samples=2)
    assert result.success == 0.25 and result.slices == {"clean": 0.0, "slip": 0.5}
    assert result.pass_at_k == 0.5 and result.mean_turns == 5.5 and result.episodes == 4
    assert result.outcomes == sorted([["054", slip, 1], ["054", clean, 0]])
    once = summarize("ckpt", episodes[:1], 0, 0, 1.0, greedy=True, samples=1)
    assert once.pass_at_k is None and once.greedy


def test_paired_rise_interval():
    bench = _bench()
    before = [["054", s, s % 2] for s in range(100)]               # half solved
    same = [list(o) for o in before]
    better = [["054", s, 1 if s % 10 else 0] for s in range(100)]  # 90 solved, every earlier success kept
    flat = bench.paired_rise(before, [same, same])
    assert flat["rise"] == 0.0 and flat["ci95"][0] <= 0.0 <= flat["ci95"][1]
    up = bench.paired_rise(before, [better])
    assert up["rise"] == 0.4 and up["ci95"][0] > 0.25
    mixed = bench.paired_rise(before, [better, same])              # the mean over two RL seeds
    assert mixed["rise"] == 0.2
    with pytest.raises(ValueError):
        bench.paired_rise(before, [[["054", s + 1, 1] for s in range(100)]])


def test_the_gate_passes_a_learning_run_and_names_each_way_a_run_fails_it():
    """bench.gate_failures, CI's gate and the bench's verdict on every run: one good run (the figures of a CI
    run, session 8) passes; each figure a wrong run shows is named."""
    bench = _bench()
    before = {"greedy": 0.5625, "greedy_slip": 0.035, "greedy_clean": 0.986}
    good = {"greedy": 0.922, "greedy_slip": 0.825, "greedy_clean": 0.986, "greedy_rise": {"rise": 0.36, "ci95": [0.28, 0.44]},
            "rollout_success": [.59, .69, .5, .75, .69, .63, .69, .5, .56, .75, .31, .5, .5, .69, .63, None],
            "served_versions": list(range(1, 16))}
    assert bench.gate_failures(before, good, 16, 1) == []
    wrong = {
        "greedy_rise": {"rise": -0.05, "ci95": [-0.12, -0.03]},     # the controls
        "greedy_slip": 0.1,                                         # the biased slice not flipped
        "rollout_success": [.7] * 5 + [.2] * 10 + [None],           # collapsed
        "served_versions": [],                                      # updates that never reached vLLM
        "greedy_clean": 0.704,                                      # the loss mask a token late (session 9)
    }
    for key, value in wrong.items():
        [why] = bench.gate_failures(before, {**good, key: value}, 16, 1)
        assert why.split()[0] in ("held-out", "biased", "sampled", "vLLM", "the"), why
    assert len(bench.gate_failures(before, {**good, "greedy_rise": {"rise": 0.2, "ci95": [-0.01, 0.4]}}, 16, 1)) == 1
    holes = [*good["rollout_success"][:7], None, *good["rollout_success"][8:]]   # a version with no episode
    assert len(bench.gate_failures(before, {**good, "rollout_success": holes}, 16, 1)) == 1
    assert len(bench.gate_failures(before, {**good, **wrong}, 16, 1)) == 5
