"""A GRPO group of episodes (same task, several attempts) -> one AReaL batch with group-relative rewards.

Why we normalise here and set ``actor.reward_norm: null`` in the config: AReaL's group normalisation
slices the concatenated batch into fixed blocks of ``group_size`` *rows*. Our episodes yield a varying
number of rows (one per turn), and a failed episode yields none, so those blocks would straddle episodes
and even tasks. Here the group is known exactly (the attempts this workflow ran for one task), so each
episode's reward is centred (and scaled) against its own siblings before it is copied onto its rows.
AReaL must not centre them again (``adv_norm.mean_level: null``; CUAConfig refuses a batch mean).

Each episode weighs the same whatever its length: AReaL's loss is a mean over the batch's tokens, so an
episode's pull grows with the tokens it trained (a 20-turn failure about 7x a 3-turn success). Each
episode's value is therefore scaled by the group's mean trained tokens over its own (``episode_weights``),
which keeps the group's total weight and makes its episodes equal.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from areal.utils.data import concat_padded_tensors

from cua_rl.policy.records import Turn, tensor_sha256

from .pixels import image_blocks, pack_rows
from .rows import ExportStyle, episode_rows, turn_key

logger = logging.getLogger(__name__)


@dataclass
class EpisodeOutcome:
    """One finished, evaluated episode: its recorded turns and its task reward (0..1); ``monitor_uuid`` is
    its rollout's client_id in the Training Monitor (None when it is not reported)."""

    turns: list[Turn]
    reward: float
    info: dict[str, Any] = field(default_factory=dict)
    monitor_uuid: str | None = None


def normalise_group(rewards: list[float], scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO advantages of one group: ``r - mean`` (divided by the std when ``scale_by_std``)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / max(1, len(rewards) - 1)) if len(rewards) > 1 else 0.0
    return [c / (std + eps) for c in centred]


def episode_weights(outcomes: list[EpisodeOutcome]) -> list[float]:
    """Per-episode scale that gives every episode of a group the same total weight under a token-mean loss:
    the group's mean trained (output) tokens over the episode's own; 0 for an episode that trained none."""
    tokens = [sum(len(t.output_ids) for t in o.turns) for o in outcomes]
    trained = [n for n in tokens if n]
    if not trained:
        return [0.0] * len(outcomes)
    mean = sum(trained) / len(trained)
    return [mean / n if n else 0.0 for n in tokens]


def shuffle_rewards(outcomes: list[EpisodeOutcome], key: str) -> list[EpisodeOutcome]:
    """The negative control of the learning gate: the group's rewards dealt to its episodes by a permutation
    seeded with ``key``. Every group keeps its reward statistics; which episode earned which reward is lost,
    so a run trained on this must not improve. Never for real training."""
    rewards = [o.reward for o in outcomes]
    random.Random(key).shuffle(rewards)
    return [replace(o, reward=r, info={**o.info, "true_reward": o.reward}) for o, r in zip(outcomes, rewards)]


class ScreenshotSwap:
    """The second negative control of the learning bench (``trajectory.shuffle_screenshots``), never for real
    training: every screenshot a group trains on is replaced by one that an earlier group of this process
    showed (same image grid), so the rows keep their tokens, actions and rewards but no longer show the screen
    the action was chosen on. A run trained on this must not learn what depends on the screen. The same
    screenshot maps to the same stand-in within a group (the turns of a concat row stay consistent); a group
    finished before any other (the first of a run) keeps its own. ``keep``: stand-ins kept per grid."""

    def __init__(self, seed: int | str, keep: int = 256) -> None:
        self.rng = random.Random(seed)
        self.keep = keep
        self.pool: dict[tuple, dict[str, Any]] = {}   # image grid -> {hash: pixel block}

    def __call__(self, outcomes: list[EpisodeOutcome]) -> list[EpisodeOutcome]:
        stand_in: dict[str, Any] = {}   # hash of a screenshot of this group -> the block it trains with
        seen: list[tuple[tuple, str, Any]] = []

        def swap(mmi: dict | None) -> dict | None:
            if not mmi or "pixel_values" not in mmi or "image_grid_thw" not in mmi:
                return mmi
            out = []
            for grid, block in image_blocks(mmi):
                key = tensor_sha256(block)
                if key not in stand_in:
                    seen.append((grid, key, block))
                    earlier = list(self.pool.get(grid, {}).values())
                    stand_in[key] = self.rng.choice(earlier) if earlier else block
                out.append(stand_in[key])
            return {**mmi, "pixel_values": torch.cat(out)}

        swapped = [replace(o, turns=[replace(t, multi_modal_input=swap(t.multi_modal_input)) for t in o.turns])
                   for o in outcomes]
        for grid, key, block in seen:   # after the swap: a group never trains on its own screenshots
            kept = self.pool.setdefault(grid, {})
            kept[key] = block
            while len(kept) > self.keep:
                kept.pop(next(iter(kept)))
        return swapped


def group_batch(outcomes: list[EpisodeOutcome], *, normalise: bool = True, scale_by_std: bool = True,
                style: ExportStyle = "individual", discount: float = 1.0,
                equal_episode_weight: bool = True, compact_images: bool = True) -> dict[str, Any] | None:
    """Rows of all episodes of one group, concatenated; None when no episode produced a row. When any
    episode is reported to the monitor, every row carries ``monitor_turn`` (rows.py). ``compact_images``: each
    row's ``pixel_values`` as palette codes (pixels.py, bit-equal once decoded; the trainer needs
    ``cua_rl.areal_ext.compact_images``, which the training workers enable)."""
    if not outcomes:
        return None
    raw = [o.reward for o in outcomes]
    values = normalise_group(raw, scale_by_std) if normalise else raw
    if equal_episode_weight:
        values = [v * w for v, w in zip(values, episode_weights(outcomes))]
    keyed = any(o.monitor_uuid for o in outcomes)
    rows: list[dict[str, Any]] = []
    for outcome, value in zip(outcomes, values):
        keys = None
        if keyed:
            keys = [turn_key(outcome.monitor_uuid, i + 1) if outcome.monitor_uuid else 0
                    for i in range(len(outcome.turns))]
        rows.extend(episode_rows(outcome.turns, value, style, discount, keys))
    if not rows:
        logger.warning("group of %d episodes recorded no model turns; nothing to train", len(outcomes))
        return None
    batch = concat_padded_tensors(rows)
    if compact_images:
        batch["multi_modal_input"] = pack_rows(batch["multi_modal_input"])
    return batch
