"""Opt-in reward shaping from the Windows-VM GRPO example: a format term and an action-quality term added to
the gym's evaluation score, so that a group whose episodes all score 0 on the task still differs.

Why opt-in (``trajectory.format_reward`` / ``trajectory.action_reward``, both 0 by default): the terms pay for
behaviour, not for solving the task, and a policy learns to collect them. The example's own history shows
both sides: shaping taught the action format while no episode solved anything, and then flattened GRPO's
variance once every sample had valid tags (docs/policy-and-training.md, "Reward shaping"). The task's own
score stays in the episode's info (``env_reward``) and is what success and the monitor's task success use.

- format: the fraction of the agent's steps whose model output was a valid action (the agent marks the
  others ``invalid``);
- action quality: the fraction of actions the gym performed (neither refused nor failed).
"""

from __future__ import annotations


def step_quality(steps: list[dict]) -> tuple[float, float]:
    """(format fraction, action-quality fraction) of a run's steps (the agent's step records)."""
    if not steps:
        return 0.0, 0.0
    valid = sum(1 for s in steps if not s.get("invalid"))
    actions = [a for s in steps for a in s.get("actions") or []]
    performed = sum(1 for a in actions if not a.get("rawFeedback") and (a.get("rawResult") or {}).get("ok", True))
    return valid / len(steps), (performed / len(actions) if actions else 0.0)


def shaped_reward(env_reward: float, steps: list[dict], format_weight: float, action_weight: float) -> float:
    """``env_reward`` plus the weighted terms; exactly ``env_reward`` when both weights are 0."""
    if not format_weight and not action_weight:
        return env_reward
    fmt, quality = step_quality(steps)
    return env_reward + format_weight * fmt + action_weight * quality
