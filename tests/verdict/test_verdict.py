"""The run's verdict on learning (cua_rl/verdict.py): when it applies, what it says for each kind of outcome,
what its kept score of the starting policy is keyed by, and that a failing verdict is reported without
touching the run (its saved config). The whole path, a real run judging itself, is the learning gate's
README-command test (tests/e2e/test_learning_gate.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from cua_rl import verdict
from cua_rl.run.launch import give_verdict, load_config, verdict_tasks

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "cua_rl" / "recipes"
PINNED = ROOT / "cua_rl" / "recipes" / "pinned" / "warm-starts" / "multiturn"


def _regime(before: float, after: float, low: float, high: float) -> dict:
    return {"before": before, "after": after, "rise": round(after - before, 4), "ci95": [low, high], "units": 31,
            "instances": 64}


def test_the_summary_says_learned_only_when_every_gated_regime_rose_with_its_interval_above_zero():
    learned = {"instances": _regime(0.53, 1.0, 0.24, 0.66), "content": _regime(0.58, 0.94, 0.15, 0.56)}
    assert verdict.describe(learned)[0].startswith("LEARNED")
    mixed = {**learned, "content": _regime(0.58, 0.70, -0.02, 0.25)}   # a rise whose interval reaches 0
    assert verdict.describe(mixed)[0] == "MIXED: a clear rise in instances only"
    worse = {**learned, "content": _regime(0.58, 0.30, -0.45, -0.10)}
    assert verdict.describe(worse)[0].startswith("WORSE: held-out greedy success fell in content")
    flat = {"instances": _regime(0.5, 0.55, -0.05, 0.15), "content": _regime(0.5, 0.5, -0.1, 0.1)}
    summary, lines = verdict.describe(flat)
    assert summary.startswith("NO CLEAR LEARNING")
    assert lines[0] == ("instances: 0.500 -> 0.550, rise +0.050 (95% interval [-0.050, +0.150] over 31 content "
                        "units, 64 instances, greedy)")


def test_the_verdict_applies_to_the_embedded_curriculum_on_the_cpu_and_says_why_not_elsewhere():
    assert verdict_tasks(load_config(str(RECIPES / "config.multiturn.yaml"), [])) == (["056"], None)
    _, why = verdict_tasks(load_config(str(RECIPES / "config.multiturn.yaml"), ["verdict.enabled=false"]))
    assert why == "off (verdict.enabled=false)"
    _, why = verdict_tasks(load_config(str(RECIPES / "config.cpu.yaml"),
                                              ["gym_base_url=http://gym.example:8080", "gym_id=desktop"]))
    assert "cua-eval" in why
    # a family without the content regime (click-square: unseen instances only) has no gated pair to judge
    _, why = verdict_tasks(load_config(str(RECIPES / "config.multiturn.yaml"), ["task_source.task_ids=[050]"]))
    assert why and "050" in why


def test_the_kept_score_follows_the_weights_and_the_settings_not_the_path(tmp_path):
    config = load_config(str(RECIPES / "config.multiturn.yaml"), [])
    key = verdict.kept_score(config, ["054"], PINNED)
    copy = shutil.copytree(PINNED, tmp_path / "copy")
    assert verdict.kept_score(config, ["054"], copy) == key   # the same weights elsewhere: the same score
    fewer = load_config(str(RECIPES / "config.multiturn.yaml"), ["verdict.instances=32"])
    assert verdict.kept_score(fewer, ["054"], PINNED) != key
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")   # other weights' files
    assert verdict.kept_score(config, ["054"], copy) != key
    assert verdict.kept_score(config, ["054"], tmp_path / "Qwen--not-a-directory") is None   # not kept: measured


def test_a_failing_verdict_is_reported_and_leaves_the_runs_saved_config_alone(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "config.yaml").write_text("the run's own config\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    give_verdict(str(tmp_path / "missing.yaml"), [], PINNED, logs, env)
    out = capsys.readouterr().out
    assert "[cua-rl] verdict:     judging the run on held-out tasks" in out
    assert "[cua-rl] verdict:     FAILED (exit code 1): see verdict.log" in out, out
    assert (logs / "config.yaml").read_text() == "the run's own config\n"
    assert "config file not found" in (logs / "verdict.log").read_text()


def test_the_pinned_warm_starts_score_is_the_one_the_gates_run_keeps():
    """The learning gate's run finds the pinned warm start's held-out score under the key its verdict computes now
    (tests/warm_starts.py says why it is pinned): a change to the evaluation's code, the episode settings or the
    warm start makes it stale, and CI would measure it again (about 4 minutes). Re-pin with
    ``python scripts/pin_warm_starts.py --score``."""
    import json

    from cua_rl.local_gym.curriculum import GATED
    from tests.warm_starts import GATE_EPISODES as EPISODES, PINNED_SCORES, gate_score_file

    pinned, key = sorted(f.name for f in PINNED_SCORES.glob("verdict-*.json")), gate_score_file(EPISODES).name
    assert pinned == [key], (f"the pinned score {pinned} is not the one the gate's run keeps now ({key}): "
                             "python scripts/pin_warm_starts.py --score")
    record = json.loads((PINNED_SCORES / pinned[0]).read_text())
    score = record["score"]
    assert score["greedy"] and score["dropped"] == 0 and score["model_errors"] == 0, score
    assert sorted(score["regimes"]) == sorted(GATED)
    assert all(r["episodes"] == EPISODES for r in score["regimes"].values())
    assert len(score["outcomes"]) == EPISODES * len(GATED) and record["cpu"], record.keys()
