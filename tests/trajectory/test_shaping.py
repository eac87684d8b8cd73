"""Opt-in reward shaping: off by default (the reward is the gym's score exactly), and when on, each term
moves with what it measures, on step records shaped like the agent's (``local_agent/runner.py``)."""

from __future__ import annotations

import pytest

from cua_rl.trajectory.config import TrajectoryConfig
from cua_rl.trajectory.shaping import shaped_reward, step_quality


def _step(invalid: str | None = None, *results: dict | None) -> dict:
    step = {"actions": [{"name": "click", "rawResult": r, **({"rawFeedback": "refused"} if r is None else {})}
                        for r in results]}
    if invalid:
        step["invalid"] = invalid
    return step


STEPS = [_step(None, {"ok": True}), _step("no action tag"), _step(None, {"ok": False, "error": "x"}),
         _step(None, None), _step(None, {"ok": True}, {"ok": True})]


def test_terms_count_valid_outputs_and_performed_actions():
    assert step_quality(STEPS) == (pytest.approx(4 / 5), pytest.approx(3 / 5))
    assert step_quality([]) == (0.0, 0.0)


def test_off_by_default_and_weighted_when_on():
    cfg = TrajectoryConfig()
    assert shaped_reward(0.25, STEPS, cfg.format_reward, cfg.action_reward) == 0.25
    assert shaped_reward(0.0, STEPS, 0.1, 0.0) == pytest.approx(0.08)
    assert shaped_reward(1.0, STEPS, 0.1, 0.5) == pytest.approx(1.0 + 0.08 + 0.3)
    # a better-behaved episode of the same task score gets more: the variance GRPO needs
    assert shaped_reward(0.0, STEPS[:1], 0.1, 0.5) > shaped_reward(0.0, STEPS, 0.1, 0.5)


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="format_reward"):
        TrajectoryConfig(format_reward=-0.1)
    with pytest.raises(ValueError, match="action_reward"):
        TrajectoryConfig(action_reward=100)
