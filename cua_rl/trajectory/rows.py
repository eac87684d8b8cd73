"""Recorded turns + an episode reward -> AReaL training rows (tensor dicts with batch dimension 1).

A row is what ``areal/workflow/vision_rlvr.py`` builds for one generation: prompt ids masked out
(loss_mask 0, logprob 0, version -1), the sampled completion masked in with the engine's logprobs and
policy versions, ``mm_token_type_ids`` for Qwen-VL's 3-D positions, and the prompt's image tensors in
``multi_modal_input``. Every row carries the same keys (``concat_padded_tensors`` requires it), so a
text-only row has ``multi_modal_input=[{}]``.

With the Training Monitor on, every row also carries ``monitor_turn``: per token, the ``turn_key`` of the
turn whose output that token is (0 elsewhere). The trainer reads it next to its recomputed logprobs to send
them to the monitor (``cua_rl.areal_ext.trainer_logprobs``); the loss never reads it.

Export styles:
- ``individual`` (default): one row per turn. Always correct; the history is repeated in every row.
- ``concat``: one row per episode, only when every turn's prompt starts with the previous turn's prompt
  and output token for token (then the last row contains all earlier ones). Dropping old screenshots or
  re-rendered assistant text breaks the chain; the episode then falls back to ``individual``.

Context turns (a tree group's continuation, ``cua_rl.trajectory.tree``): turns that come before the ones a row
trains, on the same path, and are trained in a row of their own. In ``concat`` they are the row's leading part with
loss mask 0 (their outputs are prompt to the turns after them); in ``individual`` each trained turn's prompt holds
them already, so they add nothing.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Literal

import torch

from cua_rl.policy.records import Turn

logger = logging.getLogger(__name__)

ExportStyle = Literal["individual", "concat"]

# A turn's identity packed into one int64, so a training row can carry it to the trainer as a tensor
# (``monitor_turn``) and the trainer can name the turn its recomputed logprobs belong to: the rollout
# uuid is 53 random bits written as 14 hex digits, the turn number takes the low 10 bits (0 = no turn).
_ROLLOUT_BITS, _TURN_BITS = 53, 10
TURN_KEY_ROW = "monitor_turn"   # the training rows' key holding each output token's turn_key


def new_rollout_uuid() -> str:
    """A fresh rollout client_id that ``turn_key`` can pack (collisions: ~5e-5 per million rollouts)."""
    return f"{secrets.randbits(_ROLLOUT_BITS) or 1:014x}"


def turn_key(rollout_uuid: str, turn: int) -> int:
    """The turn as a positive int64, or 0 when the uuid is not one of ``new_rollout_uuid`` or the turn is
    out of range (such a turn's trainer logprobs are not reported)."""
    try:
        rollout = int(rollout_uuid, 16)
    except (TypeError, ValueError):
        return 0
    if len(rollout_uuid) != 14 or not 0 < rollout < 2 ** _ROLLOUT_BITS or not 0 < turn < 2 ** _TURN_BITS:
        return 0
    return (rollout << _TURN_BITS) | turn


def turn_of_key(key: int) -> tuple[str, int]:
    """``(rollout_uuid, turn)`` of a ``turn_key``."""
    if key <= 0:
        raise ValueError(f"not a turn key: {key}")
    return f"{key >> _TURN_BITS:014x}", key & (2 ** _TURN_BITS - 1)


def _row(ids: list[int], loss_mask: list[int], logprobs: list[float], versions: list[int],
         mm_types: list[int] | None, mmi: dict | None, reward: float,
         monitor_turn: list[int] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "input_ids": torch.tensor([ids], dtype=torch.long),
        "loss_mask": torch.tensor([loss_mask], dtype=torch.int32),
        "logprobs": torch.tensor([logprobs], dtype=torch.float32),
        "versions": torch.tensor([versions], dtype=torch.int32),
        "attention_mask": torch.ones((1, len(ids)), dtype=torch.bool),
        "rewards": torch.tensor([reward], dtype=torch.float32),
        "multi_modal_input": [dict(mmi) if mmi else {}],
    }
    if mm_types is not None:
        row["mm_token_type_ids"] = torch.tensor([mm_types], dtype=torch.long)
    if monitor_turn is not None:
        row[TURN_KEY_ROW] = torch.tensor([monitor_turn], dtype=torch.long)
    return row


def turn_row(turn: Turn, reward: float, key: int | None = None) -> dict[str, Any]:
    """One turn as one training row (``key``: its monitor ``turn_key``, None = no ``monitor_turn``)."""
    p, g = len(turn.prompt_ids), len(turn.output_ids)
    mm = None if turn.prompt_mm_token_type_ids is None else list(turn.prompt_mm_token_type_ids) + [0] * g
    return _row(list(turn.prompt_ids) + list(turn.output_ids), [0] * p + [1] * g,
                [0.0] * p + list(turn.output_logprobs), [-1] * p + list(turn.output_versions),
                mm, turn.multi_modal_input, reward, None if key is None else [0] * p + [key] * g)


def is_prefix_chain(turns: list[Turn]) -> bool:
    """True when each turn's prompt extends the previous turn's prompt + output exactly."""
    for prev, cur in zip(turns, turns[1:]):
        full = list(prev.prompt_ids) + list(prev.output_ids)
        if len(cur.prompt_ids) < len(full) or list(cur.prompt_ids[: len(full)]) != full:
            return False
    return True


def concat_row(turns: list[Turn], reward: float, keys: list[int] | None = None,
               context: list[Turn] | tuple = ()) -> dict[str, Any]:
    """All turns of a prefix chain as one row: every turn's completion is trained, nothing else
    (``keys``: the turns' monitor ``turn_key``s, None = no ``monitor_turn``). ``context``: turns before
    ``turns`` on the same chain, in the row but loss-masked (module docstring)."""
    chain = [*context, *turns]
    if not turns or not is_prefix_chain(chain):
        raise ValueError("concat_row needs a non-empty strict prefix chain of turns")
    last = chain[-1]
    ids = list(last.prompt_ids) + list(last.output_ids)
    n = len(ids)
    loss_mask, logprobs, versions, owner = [0] * n, [0.0] * n, [-1] * n, [0] * n
    for i, t in enumerate(turns):
        start, key = len(t.prompt_ids), keys[i] if keys is not None else 0
        for j, (lp, v) in enumerate(zip(t.output_logprobs, t.output_versions)):
            loss_mask[start + j], logprobs[start + j], versions[start + j], owner[start + j] = 1, lp, v, key
    mm = None
    if last.prompt_mm_token_type_ids is not None:
        mm = list(last.prompt_mm_token_type_ids) + [0] * len(last.output_ids)
    return _row(ids, loss_mask, logprobs, versions, mm, last.multi_modal_input, reward,
                owner if keys is not None else None)


def turn_rewards(reward: float, n_turns: int, discount: float = 1.0) -> list[float]:
    """Reward of each turn's row: the episode reward, discounted by ``discount`` per turn before the end
    (``discount=1`` gives every turn the full reward; <1 credits late turns more)."""
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"turn discount must be in (0, 1], got {discount}")
    return [reward * discount ** (n_turns - 1 - i) for i in range(n_turns)]


def rows_of(turns: list[Turn], style: ExportStyle, context: list[Turn] | tuple = ()) -> int:
    """How many training rows ``episode_rows`` makes of these turns in ``style``."""
    if not turns:
        return 0
    return 1 if style == "concat" and is_prefix_chain([*context, *turns]) else len(turns)


def episode_rows(turns: list[Turn], reward: float, style: ExportStyle = "individual",
                 discount: float = 1.0, keys: list[int] | None = None,
                 context: list[Turn] | tuple = ()) -> list[dict[str, Any]]:
    """Training rows of one episode (empty when it has no turns); ``keys``: each turn's monitor
    ``turn_key`` (0 = not reported), None = rows without ``monitor_turn``; ``context``: turns before these on
    their path, never trained here (module docstring)."""
    if style not in ("individual", "concat"):
        raise ValueError(f"export style must be 'individual' or 'concat', got {style!r}")
    if keys is not None and len(keys) != len(turns):
        raise ValueError(f"{len(keys)} monitor keys for {len(turns)} turns")
    if not turns:
        return []
    if style == "concat":
        if is_prefix_chain([*context, *turns]):
            return [concat_row(turns, reward, keys, context)]
        logger.info("episode is not a prefix chain (%d turns); exporting one row per turn", len(turns))
    rewards = turn_rewards(reward, len(turns), discount)
    return [turn_row(t, r, None if keys is None else keys[i]) for i, (t, r) in enumerate(zip(turns, rewards))]
