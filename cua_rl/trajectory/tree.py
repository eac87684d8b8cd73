"""A tree group (docs/learning.md "Tree groups") -> the value of each segment and its rows.

A tree group is M roots played on one task instance; at chosen turns the workflow forks a root's execution and
K continuations play on from the same screen and the same prompt (``cua_rl.workflow.tree``). Its turns fall into
**segments**: the turns one path played between two branch points. A root's turns before its first branch point
are one segment; at a branch point the segment has K + 1 children: the root's own continuation and the K forked
ones. A leaf is a segment with no children; its execution's evaluation is its reward.

The estimator: every segment is credited with how much better its subtree did than the state it started from.

- The value of a segment is its reward for a leaf, else the mean of its children's values (a Monte Carlo estimate
  of the value of the state at its end: the K + 1 continuations are independent samples of the policy there).
  With one branch point this is the mean of the segment's leaves.
- Siblings: the M roots (they start from the task's first screen), and each segment's children (they start from
  its last screen). A segment's advantage is its value against its siblings' mean, normalised and weighted exactly
  as a GRPO group's episodes are (``cua_rl.trajectory.groups.episode_values``, with the segments as episodes): so
  ``trajectory.normalise_in_group``, ``scale_by_std``, ``equal_episode_weight`` (each segment of a sibling set
  weighs the same whatever its turns) and ``group_weight`` (each sibling set pulls the same) mean what they mean
  for groups.
- The shared prefix is trained once, in its own segment's rows, with the root-level advantage; a continuation's
  rows train its own turns only: in ``concat`` rows the prefix is there as loss-masked context
  (``cua_rl.trajectory.rows``), in per-turn rows each prompt holds it already.

A tree without a branch (every fork refused, or no root reached a branch turn) is exactly a GRPO group: M leaves,
each one segment. Sources and how this differs from them: docs/learning.md "Tree groups".
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterator

from cua_rl.policy.records import Turn

from .groups import EpisodeOutcome, episode_values, rows_batch, trained_tokens
from .rows import ExportStyle, episode_rows, rows_of, turn_key


@dataclass(eq=False)
class Segment:
    """The turns one path played between two branch points (module docstring). ``turns``: its own, trained in
    its rows; ``context``: every turn before them on its path (its prompts continue them; never trained here);
    ``children``: the continuations forked at its end (empty: a leaf); ``reward``: a leaf's evaluation;
    ``monitor_uuid`` and ``first_turn``: the rollout whose execution played these turns and the number of the first
    one on its path (the monitor's turn keys); ``info``: what the workflow keeps of the leaf's episode."""

    turns: list[Turn]
    context: list[Turn] = field(default_factory=list)
    children: list["Segment"] = field(default_factory=list)
    reward: float | None = None
    monitor_uuid: str | None = None
    first_turn: int = 1
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> list[Turn]:
        """Every turn of its path up to its end."""
        return [*self.context, *self.turns]


def walk(roots: list[Segment]) -> Iterator[Segment]:
    """Every segment, depth first, each before its children."""
    stack = list(reversed(roots))
    while stack:
        segment = stack.pop()
        yield segment
        stack.extend(reversed(segment.children))


def leaves(roots: list[Segment]) -> list[Segment]:
    """The leaves (one per evaluated execution), depth first."""
    return [s for s in walk(roots) if not s.children]


def sibling_sets(roots: list[Segment]) -> list[list[Segment]]:
    """The roots, then each segment's children: the sets whose members are compared with each other."""
    return [list(roots), *[s.children for s in walk(roots) if s.children]]


def value_of(segment: Segment) -> float:
    """A leaf's reward; else the mean of its children's values."""
    if not segment.children:
        if segment.reward is None:
            raise ValueError("a leaf segment without its reward")
        return float(segment.reward)
    return sum(value_of(c) for c in segment.children) / len(segment.children)


def tree_values(roots: list[Segment], *, normalise: bool = True, scale_by_std: bool = True,
                equal_episode_weight: bool = True, group_weight: str = "equal") -> dict[Segment, float]:
    """What each segment trains with (module docstring): per sibling set, ``episode_values`` of its segments
    as episodes whose rewards are their values."""
    values: dict[Segment, float] = {}
    for siblings in sibling_sets(roots):
        as_episodes = [EpisodeOutcome(turns=s.turns, reward=value_of(s)) for s in siblings]
        values.update(zip(siblings, episode_values(as_episodes, normalise=normalise, scale_by_std=scale_by_std,
                                                   equal_episode_weight=equal_episode_weight,
                                                   group_weight=group_weight)))
    return values


def tree_rows(roots: list[Segment], values: dict[Segment, float], *, style: ExportStyle = "individual",
              discount: float = 1.0, compact_images: bool = True) -> dict[str, Any] | None:
    """The tree's rows: each segment's own turns carrying its value (discounted per turn within the segment, as
    an episode's), its context loss-masked; None when no segment has a turn. With any segment reported to the
    monitor every row carries ``monitor_turn`` (rows.py), keyed by the rollout that played the turn."""
    keyed = any(s.monitor_uuid for s in walk(roots))
    rows: list[dict[str, Any]] = []
    for segment in walk(roots):
        keys = None
        if keyed:
            keys = [turn_key(segment.monitor_uuid, segment.first_turn + i) if segment.monitor_uuid else 0
                    for i in range(len(segment.turns))]
        rows.extend(episode_rows(segment.turns, values[segment], style, discount, keys, segment.context))
    return rows_batch(rows, compact_images) if rows else None


def tree_rows_count(roots: list[Segment], style: ExportStyle) -> int:
    """How many rows ``tree_rows`` makes."""
    return sum(rows_of(s.turns, style, s.context) for s in walk(roots))


def tree_trained_tokens(roots: list[Segment]) -> int:
    """The output tokens the tree trains: each turn once, in the segment that played it."""
    return sum(trained_tokens(EpisodeOutcome(turns=s.turns, reward=0.0)) for s in walk(roots))


def shuffle_leaf_rewards(roots: list[Segment], key: str) -> None:
    """The learning gate's negative control for trees (``trajectory.shuffle_rewards``), never for real training:
    the tree's leaf rewards dealt to its leaves by a permutation seeded with ``key`` (each leaf keeps its own as
    ``info["true_reward"]``)."""
    tips = leaves(roots)
    rewards = [t.reward for t in tips]
    random.Random(key).shuffle(rewards)
    for tip, reward in zip(tips, rewards):
        tip.info["true_reward"], tip.reward = tip.reward, reward
