"""The learning bench's mutations (``trajectory.mutation``): known defects switched on, never for real training.

Why: a learning gate is only evidence if it fails when training is wrong. The bench (``python
bench/learning_bench.py --recipe multiturn --mutations ...``) runs GRPO from the same warm start with one of
these on and reports whether the gate's judgement (``bench/learning_bench.py``, ``gate_failures``) still passes:

- ``negate_advantages``: every row's advantage (the group-normalised reward the rows carry) sign-flipped, so
  the policy is pushed away from what succeeded;
- ``shift_loss_mask``: each row's loss mask moved one token later, a classic off-by-one between the tokens
  and the mask (the first sampled token of each turn untrained, the token after it trained with a logprob of
  0 that the engine never gave);
- ``batch_recentring``: issue 33 (a) back on: AReaL re-centres the advantages on the batch's token mean
  (``actor.adv_norm.mean_level=batch``, which the config refuses otherwise while the workflow normalises
  within each group; set in ``cua_rl.config``).

- ``gym_faults_as_policy``: the gym's faults trained as the policy's failures (issue 59 item 2 undone): an
  episode the gym failed (an action it could not play) is evaluated and trained instead of dropped; acts in the
  episode (``cua_rl.workflow.episode``), with the embedded gym failing actions at ``embedded.fault_rate``.

Issue 33 (b), token weighting, is switched back on by its own option, ``trajectory.equal_episode_weight=false``;
weight updates that never reach vLLM by the test double of a vLLM worker that ignores them
(``vllm.worker_extension_cls=tests.doubles.stale_vllm.IgnoresWeightUpdates``, as bench/health_bench.py does).
"""

from __future__ import annotations

from typing import Any

import torch


def mutate(batch: dict[str, Any], mutation: str) -> dict[str, Any]:
    """``batch`` (one group's rows, ``group_batch``) with the row-level ``mutation`` applied (``batch_recentring``
    acts in the config instead, ``""`` is none)."""
    if mutation == "negate_advantages":
        return {**batch, "rewards": -batch["rewards"]}
    if mutation == "shift_loss_mask":
        mask = batch["loss_mask"]
        shifted = torch.zeros_like(mask)
        shifted[:, 1:] = mask[:, :-1]
        return {**batch, "loss_mask": shifted * batch["attention_mask"].to(mask.dtype)}
    return batch

