"""Evaluation replies (docs/protocols.md §1.4) and the reward they are worth.

Why rewritten: the original chain treated a real score of 0.0 as "missing" and fell through to
``success -> 1.0``, never sent the answer, and ignored scale. The rules here, in order:

1. **Total score**: the first *present* number among ``result.score``, top-level ``score``/``reward``,
   ``result.reward``, ``evaluation_result.score``, ``final_result.score``. Present means not None; 0 is a
   score and stays 0.
2. **Validators**, when there is no total: the weighted average Σ(score·weight)/Σweight over
   ``result.validators`` / ``validators`` / ``final_result.checks`` / ``evaluation_result.checks`` /
   ``checks`` (list items or an ``{id: {...}}`` mapping). A validator's score is its ``score``, or else
   1/0 from ``pass``/``passed``/``success``/``status`` (``status`` 1 or "pass"/"passed"/"success").
   Weight defaults to 1; negative weights count as 0.
3. **Success flag**, when there is neither: 1.0 if ``success`` is True, 0.0 if False.
4. Nothing usable: 0.0 with ``source="none"``.

Scale detection (0-100 vs 0-1): an explicit ``max_score``/``maxScore`` > 0 next to the score divides
by it. Otherwise a total score > 1 is read as a percentage (/100); for validators, if *any* validator
score is > 1 all validator scores of that reply are read as percentages. Known ambiguity: a 0-100 gym
reporting exactly 1 (i.e. 1 %) reads as 1.0; no gym we know of does that. The result is clamped to
[0, 1]; non-finite numbers are ignored.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


def _num(value: Any) -> float | None:
    """A finite float, or None (bools, strings that are not numbers, NaN/inf are not scores)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _passed(item: dict) -> bool | None:
    for key in ("pass", "passed", "success"):
        if isinstance(item.get(key), bool):
            return item[key]
    status = item.get("status")
    if isinstance(status, bool):
        return status
    if isinstance(status, (int, float)):
        return status == 1
    if isinstance(status, str):
        return status.lower() in ("pass", "passed", "success", "ok", "1")
    return None


@dataclass(frozen=True)
class ValidatorResult:
    """One validator/check. ``score`` is as reported (not rescaled); None when only pass/fail is known."""

    id: str
    passed: bool | None
    score: float | None
    weight: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw: dict, fallback_id: str) -> "ValidatorResult":
        weight = _num(raw.get("weight"))
        return cls(id=str(raw.get("id") or raw.get("validator_id") or raw.get("name") or fallback_id),
                   passed=_passed(raw), score=_num(raw.get("score")),
                   weight=1.0 if weight is None else max(0.0, weight), raw=raw)


def _validators(raw: dict) -> list[ValidatorResult]:
    result, final = _dict(raw.get("result")), _dict(raw.get("final_result"))
    legacy = _dict(raw.get("evaluation_result"))
    for source in (result.get("validators"), raw.get("validators"), final.get("checks"),
                   legacy.get("validators"), legacy.get("checks"), raw.get("checks")):
        if isinstance(source, dict):  # genv LocalEnv: {check_id: {status, score}}
            items = [dict(v, id=v.get("id", k)) for k, v in source.items() if isinstance(v, dict)]
        elif isinstance(source, list):
            items = [v for v in source if isinstance(v, dict)]
        else:
            continue
        if items:
            return [ValidatorResult.from_raw(v, f"validator_{i}") for i, v in enumerate(items)]
    return []


def _validator_average(validators: list[ValidatorResult]) -> float | None:
    percent = any(v.score is not None and v.score > 1.0 for v in validators)
    scored: list[tuple[float, float]] = []
    for v in validators:
        if v.score is not None:
            scored.append((v.score / 100.0 if percent else v.score, v.weight))
        elif v.passed is not None:  # pass/fail only: already on the 0-1 scale
            scored.append((1.0 if v.passed else 0.0, v.weight))
    total_weight = sum(w for _, w in scored)
    if not scored or total_weight <= 0:
        return None
    return sum(s * w for s, w in scored) / total_weight


def _total_score(raw: dict) -> tuple[float, str] | None:
    result, final = _dict(raw.get("result")), _dict(raw.get("final_result"))
    legacy = _dict(raw.get("evaluation_result"))
    candidates = (("result.score", result, "score"), ("score", raw, "score"), ("reward", raw, "reward"),
                  ("result.reward", result, "reward"), ("evaluation_result.score", legacy, "score"),
                  ("final_result.score", final, "score"))
    for source, holder, key in candidates:
        score = _num(holder.get(key))
        if score is None:
            continue
        max_score = _num(holder.get("max_score", holder.get("maxScore")))
        if max_score and max_score > 0:
            return score / max_score, source
        return (score / 100.0 if score > 1.0 else score), source
    return None


def _success(raw: dict) -> bool | None:
    for holder in (_dict(raw.get("result")), raw, _dict(raw.get("final_result")), _dict(raw.get("evaluation_result"))):
        if isinstance(holder.get("success"), bool):
            return holder["success"]
    return None


def _gym_faults(raw: dict) -> int:
    """``faults.gym`` of an evaluate reply (**extension**, docs/protocols.md 1.4): how many of the execution's
    calls failed on the gym's side; 0 when the gym does not say (a non-negative integer, else 0)."""
    value = _dict(raw.get("faults")).get("gym")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _gym_unrecovered(raw: dict) -> int | None:
    """``faults.gym_unrecovered`` (**extension**, docs/protocols.md 1.4): the gym's faults after the execution's
    last screenshot or action it served, 0 when the agent recovered from every one; None when the gym does not
    say (a non-negative integer, else None)."""
    value = _dict(raw.get("faults")).get("gym_unrecovered")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Evaluation:
    """A parsed evaluate reply. ``reward`` is in [0, 1]; ``source`` says which rule produced it; ``gym_faults``:
    the execution's calls the gym itself failed (its ``faults.gym``; 0 from a gym that does not count them);
    ``gym_unrecovered``: how many of them came after the last call it served (None when it does not say);
    ``counts_faults``: whether the reply carries ``faults`` at all."""

    reward: float
    success: bool | None
    validators: list[ValidatorResult]
    source: str
    raw: dict = field(default_factory=dict, repr=False, compare=False)
    gym_faults: int = 0
    gym_unrecovered: int | None = None
    counts_faults: bool = False

    @classmethod
    def from_raw(cls, raw: Any) -> "Evaluation":
        raw = raw if isinstance(raw, dict) else {"value": raw}
        validators = _validators(raw)
        success = _success(raw)
        total = _total_score(raw)
        if total is not None:
            reward, source = total
        elif (average := _validator_average(validators)) is not None:
            reward, source = average, "validators"
        elif success is not None:
            reward, source = (1.0 if success else 0.0), "success"
        else:
            reward, source = 0.0, "none"
            logger.warning("evaluation reply has no score, validators or success flag: %s", str(raw)[:300])
        return cls(reward=min(1.0, max(0.0, reward)), success=success, validators=validators,
                   source=source, raw=raw, gym_faults=_gym_faults(raw), gym_unrecovered=_gym_unrecovered(raw),
                   counts_faults=isinstance(raw.get("faults"), dict))


def extract_reward(raw: Any) -> float:
    """Shortcut: the reward in [0, 1] of an evaluate reply (see the module docstring for the rules)."""
    return Evaluation.from_raw(raw).reward
