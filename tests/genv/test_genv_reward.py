"""Reward extraction: the original's bugs stay fixed (0 stays 0, validators, 0-100 scale, legacy shapes)."""

import math

import pytest

from cua_rl.genv import Evaluation, extract_reward


def test_real_zero_score_stays_zero_even_with_success_true():
    ev = Evaluation.from_raw({"success": True, "result": {"score": 0.0, "success": True,
                                                          "validators": [{"id": "v", "pass": True, "score": 1.0}]}})
    assert ev.reward == 0.0
    assert ev.source == "result.score"
    assert ev.success is True
    assert [v.id for v in ev.validators] == ["v"]


def test_validator_weighted_average_without_total():
    raw = {"result": {"validators": [{"id": "a", "pass": True, "score": 1.0, "weight": 3},
                                     {"id": "b", "pass": False, "score": 0.0, "weight": 1}]}}
    ev = Evaluation.from_raw(raw)
    assert ev.reward == pytest.approx(0.75)
    assert ev.source == "validators"


def test_validators_pass_only_and_default_weight():
    raw = {"validators": [{"id": "a", "passed": True}, {"id": "b", "passed": False}, {"id": "c", "passed": True}]}
    assert extract_reward(raw) == pytest.approx(2 / 3)


@pytest.mark.parametrize("raw, reward", [
    ({"result": {"score": 85}}, 0.85),
    ({"result": {"score": 100, "success": True}}, 1.0),
    ({"score": 50}, 0.5),
    ({"result": {"score": 7, "max_score": 10}}, 0.7),
    ({"result": {"validators": [{"score": 80, "weight": 1}, {"score": 40, "weight": 1}]}}, 0.6),
    ({"result": {"validators": [{"score": 50}, {"passed": True}]}}, 0.75),  # pass-only stays on 0-1
])
def test_percent_scale_is_normalised(raw, reward):
    assert extract_reward(raw) == pytest.approx(reward)


@pytest.mark.parametrize("raw, reward", [
    ({"result": {"score": 250}}, 1.0),
    ({"result": {"score": -3}}, 0.0),
    ({"result": {"score": float("nan")}, "success": False}, 0.0),
])
def test_clamped_and_non_finite_ignored(raw, reward):
    value = extract_reward(raw)
    assert not math.isnan(value) and value == reward


def test_top_level_reward_used_when_result_has_no_score():
    assert extract_reward({"reward": 0.4, "result": {"validators": [{"score": 1.0}]}}) == pytest.approx(0.4)


def test_success_flag_only_when_nothing_else():
    assert Evaluation.from_raw({"success": True}).reward == 1.0
    assert Evaluation.from_raw({"success": False}).reward == 0.0
    assert Evaluation.from_raw({"success": True}).source == "success"


def test_nothing_usable_is_zero_and_logged(caplog):
    ev = Evaluation.from_raw({"message": "odd"})
    assert ev.reward == 0.0 and ev.source == "none" and ev.success is None
    assert "no score" in caplog.text


def test_legacy_final_result_checks():
    raw = {"final_result": {"success": False, "checks": [{"id": "c1", "passed": True}, {"id": "c2", "passed": False}]}}
    ev = Evaluation.from_raw(raw)
    assert ev.reward == pytest.approx(0.5)
    assert ev.success is False


def test_legacy_top_level_checks_and_status_mapping():
    raw = {"checks": {"wifi": {"status": 1, "score": None}, "brightness": {"status": 0}}}
    ev = Evaluation.from_raw(raw)
    assert ev.reward == pytest.approx(0.5)
    assert {v.id: v.passed for v in ev.validators} == {"wifi": True, "brightness": False}


def test_legacy_evaluation_result():
    assert extract_reward({"evaluation_result": {"score": 0.25, "success": False}}) == pytest.approx(0.25)
    assert extract_reward({"evaluation_result": {"checks": [{"passed": True}]}}) == 1.0


def test_zero_weights_fall_back_to_success():
    raw = {"success": True, "result": {"validators": [{"score": 1.0, "weight": 0}]}}
    ev = Evaluation.from_raw(raw)
    assert ev.reward == 1.0 and ev.source == "success"


def test_non_dict_reply_does_not_crash():
    assert Evaluation.from_raw(["weird"]).reward == 0.0
