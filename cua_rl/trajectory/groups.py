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

Across groups the same token-mean makes a group pull in proportion to its mean trained tokens: in a batch
that mixes tasks a 20-turn task's group weighs 10x a 2-turn task's. ``group_weight`` states the choice:
``"equal"`` (the default) divides each group's values by its mean trained tokens, so every group pulls the
same whatever its tasks' lengths (an episode's value summed over its trained tokens is then its group
advantage); ``"tokens"`` keeps AReaL's per-token weighting (a group pulls with its tokens). Only the relative
weights change: the scale of the advantages is set by AReaL's ``adv_norm`` (config.yaml: the batch's std).

``episode_values`` is the one definition of what each episode trains with: ``group_rows`` copies it onto the
rows' ``rewards`` (discounted per turn), the workflow reports it to the monitor, and ``value_bound`` says how
large it can get (AReaL clips ``rewards`` at ``actor.reward_clip`` before anything else; CUAConfig refuses a
clip that could cut these values).
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


def trained_tokens(outcome: EpisodeOutcome) -> int:
    """The tokens an episode trains: its turns' outputs (the prompt is masked out)."""
    return sum(len(t.output_ids) for t in outcome.turns)


def episode_weights(outcomes: list[EpisodeOutcome]) -> list[float]:
    """Per-episode scale that gives every episode of a group the same total weight under a token-mean loss:
    the group's mean trained (output) tokens over the episode's own; 0 for an episode that trained none."""
    tokens = [trained_tokens(o) for o in outcomes]
    mean = _mean_trained(tokens)
    return [mean / n if n else 0.0 for n in tokens] if mean else [0.0] * len(outcomes)


def _mean_trained(tokens: list[int]) -> float:
    """Mean trained tokens over the episodes that trained any (0.0 when none did)."""
    trained = [n for n in tokens if n]
    return sum(trained) / len(trained) if trained else 0.0


GROUP_WEIGHTS = ("equal", "tokens")


def episode_values(outcomes: list[EpisodeOutcome], *, normalise: bool = True, scale_by_std: bool = True,
                   equal_episode_weight: bool = True, group_weight: str = "equal") -> list[float]:
    """The value each episode of one group trains with (module docstring): its reward, normalised within the
    group (``normalise``, ``scale_by_std``), times its episode weight (``equal_episode_weight``), divided by
    the group's mean trained tokens when ``group_weight`` is ``"equal"``."""
    if group_weight not in GROUP_WEIGHTS:
        raise ValueError(f"group_weight must be one of {GROUP_WEIGHTS}, got {group_weight!r}")
    raw = [o.reward for o in outcomes]
    values = normalise_group(raw, scale_by_std) if normalise else raw
    if equal_episode_weight:
        values = [v * w for v, w in zip(values, episode_weights(outcomes))]
    if group_weight == "equal":
        mean = _mean_trained([trained_tokens(o) for o in outcomes])
        values = [v / mean if mean else 0.0 for v in values]
    return values


def value_bound(group_size: int, max_turns: int, max_new_tokens: int, *, normalise: bool = True,
                scale_by_std: bool = True, equal_episode_weight: bool = True, group_weight: str = "equal",
                reward_range: float = 1.0) -> float:
    """The largest |value| ``episode_values`` can give an episode of a group of at most ``group_size``
    evaluated episodes, each of at most ``max_turns`` turns of at most ``max_new_tokens`` trained tokens and
    rewards within ``[0, reward_range]``.

    A normalised value is at most (n-1)/sqrt(n) (one outlier against n-1 equal siblings, sample std), a centred
    one (n-1)/n of the range; the episode weight is largest for a 1-token episode among siblings of the most
    tokens: ((n-1) x max_turns x max_new_tokens + 1) / n. Dividing by the group's mean trained tokens
    (``"equal"``) leaves at most the normalised value over the episode's own tokens (>= 1)."""
    n = max(1, group_size)
    if normalise and scale_by_std:
        bound = (n - 1) / math.sqrt(n)
    elif normalise:
        bound = reward_range * (n - 1) / n
    else:
        bound = reward_range
    if equal_episode_weight and group_weight == "tokens":
        bound *= ((n - 1) * max(1, max_turns) * max(1, max_new_tokens) + 1) / n
    return bound


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


@dataclass
class GroupRows:
    """One group as AReaL trains it: ``batch`` (its rows; None when no episode produced a row) and ``values``
    (each episode's value, ``episode_values``: what its rows carry, before the per-turn discount)."""

    batch: dict[str, Any] | None
    values: list[float]


def group_rows(outcomes: list[EpisodeOutcome], values: list[float], *, style: ExportStyle = "individual",
               discount: float = 1.0, compact_images: bool = True) -> dict[str, Any] | None:
    """Rows of all episodes of one group, each episode's rows carrying its ``values`` entry (``episode_values``),
    concatenated; None when no episode produced a row. When any episode is reported to the monitor, every row
    carries ``monitor_turn`` (rows.py). ``compact_images``: each row's ``pixel_values`` as palette codes
    (pixels.py, bit-equal once decoded; the trainer needs ``cua_rl.areal_ext.compact_images``, which the
    training workers enable)."""
    if len(values) != len(outcomes):
        raise ValueError(f"{len(values)} values for {len(outcomes)} episodes")
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
    return rows_batch(rows, compact_images)


def rows_batch(rows: list[dict[str, Any]], compact_images: bool = True) -> dict[str, Any]:
    """One group's rows as one batch (``group_rows``; the tree's rows, ``cua_rl.trajectory.tree``)."""
    batch = concat_padded_tensors(rows)
    if compact_images:
        batch["multi_modal_input"] = pack_rows(batch["multi_modal_input"])
    return batch


def build_group(outcomes: list[EpisodeOutcome], *, normalise: bool = True, scale_by_std: bool = True,
                style: ExportStyle = "individual", discount: float = 1.0, equal_episode_weight: bool = True,
                group_weight: str = "equal", compact_images: bool = True) -> GroupRows:
    """``episode_values`` of the group, and its rows carrying them (``group_rows``)."""
    values = episode_values(outcomes, normalise=normalise, scale_by_std=scale_by_std,
                            equal_episode_weight=equal_episode_weight, group_weight=group_weight)
    batch = group_rows(outcomes, values, style=style, discount=discount, compact_images=compact_images) \
        if outcomes else None
    return GroupRows(batch, values)


def group_batch(outcomes: list[EpisodeOutcome], **options) -> dict[str, Any] | None:
    """The rows of ``build_group`` (same options), or None."""
    return build_group(outcomes, **options).batch
