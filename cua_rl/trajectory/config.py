"""The ``trajectory`` section of the run's config: how recorded turns become training rows and what each episode
trains with (export style, per-turn discount, group normalisation and weights, the learning bench's controls and
mutations, opt-in shaping). It lives beside the room it configures; ``cua_rl.config.CUAConfig`` holds it as its
``trajectory`` field and checks it against AReaL's own settings (its reward normalisation above all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .groups import GROUP_WEIGHTS

EXPORT_STYLES = ("individual", "concat")
# trajectory.mutation: the learning bench's mutations (cua_rl/trajectory/mutations.py), never for real training
MUTATIONS = ("", "negate_advantages", "shift_loss_mask", "batch_recentring", "gym_faults_as_policy")


@dataclass
class TrajectoryConfig:
    """How recorded turns become training rows (cua_rl/trajectory; docs/policy-and-training.md)."""

    export_style: str = field(default="individual", metadata={
        "help": "individual: one row per turn (always valid); concat: one row per episode when every prompt "
                "extends the previous turn exactly (falls back to per-turn rows otherwise).",
        "choices": list(EXPORT_STYLES)})
    turn_discount: float = field(default=1.0, metadata={
        "help": "Per-turn credit: turn t of T gets reward * turn_discount ** (T - 1 - t); 1.0 = terminal reward "
                "everywhere."})
    normalise_in_group: bool = field(default=True, metadata={
        "help": "GRPO inside the workflow: rewards minus the group mean (divided by the group std when "
                "scale_by_std)."})
    scale_by_std: bool = field(default=True, metadata={
        "help": "Divide each group's centred rewards by the group's standard deviation."})
    equal_episode_weight: bool = field(default=True, metadata={
        "help": "Every episode weighs the same under AReaL's token-mean loss whatever its length (each episode's "
                "value times the group's mean trained tokens over its own); off, a 20-turn failure outweighs a "
                "3-turn success."})
    group_weight: str = field(default="equal", metadata={
        "help": "How groups weigh against each other in a batch (cua_rl/trajectory/groups.py): \"equal\" = every "
                "group pulls the same whatever its tasks' lengths (each group's values over its mean trained "
                "tokens); \"tokens\" = AReaL's token-mean as it is, a group pulls in proportion to its mean trained "
                "tokens (a 20-turn task's group 10x a 2-turn task's in a mixed batch).",
        "choices": list(GROUP_WEIGHTS)})
    drop_zero_variance: bool = field(default=False, metadata={
        "help": "Return nothing for a group whose episodes all train with value 0 (every reward equal: no GRPO "
                "signal); its stream item is recorded as dropped (resume). AReaL then samples another group in its "
                "place."})
    min_group_size: int | None = field(default=None, metadata={
        "help": "Fewer evaluated episodes than this in a group drops the group (a lone episode has no baseline). "
                "null = min(2, group size)."})
    shuffle_rewards: bool = field(default=False, metadata={
        "help": "Negative control of the learning gate (bench/learning_bench.py), never for real training: each "
                "group's rewards are dealt to its episodes by a seeded permutation before the advantages are "
                "computed."})
    shuffle_screenshots: bool = field(default=False, metadata={
        "help": "The second negative control (trajectory.groups.ScreenshotSwap), never for real training: each "
                "group trains on screenshots other groups showed, so the screen no longer matches the action."})
    mutation: str = field(default="", metadata={
        "help": "The learning bench's mutations (cua_rl/trajectory/mutations.py), never for real training: a known "
                "defect switched on, so the bench can show that the learning gate fails on it. \"\" = none.",
        "choices": list(MUTATIONS)})
    format_reward: float = field(default=0.0, metadata={
        "help": "Opt-in shaping (cua_rl/trajectory/shaping.py): the reward trained on is the evaluation's score "
                "plus format_reward * (fraction of valid model outputs) + action_reward * (fraction of actions "
                "performed)."})
    action_reward: float = field(default=0.0, metadata={
        "help": "Opt-in shaping: this times the fraction of the episode's actions performed is added to its reward "
                "(see format_reward)."})

    def __post_init__(self):
        if self.export_style not in EXPORT_STYLES:
            raise ValueError(f"trajectory.export_style must be one of {EXPORT_STYLES}, got {self.export_style!r}")
        if self.mutation not in MUTATIONS:
            raise ValueError(f"trajectory.mutation must be one of {MUTATIONS}, got {self.mutation!r}")
        if not 0.0 < self.turn_discount <= 1.0:
            raise ValueError(f"trajectory.turn_discount must be within (0, 1], got {self.turn_discount}")
        if self.export_style == "concat" and self.turn_discount < 1.0:
            raise ValueError(f"trajectory.turn_discount {self.turn_discount} needs export_style individual: a concat "
                             f"row trains every turn of its episode with one value, so the discount would be ignored")
        for name in ("format_reward", "action_reward"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                raise ValueError(f"trajectory.{name} must be within [0, 10], got {getattr(self, name)}")
        if self.min_group_size is not None and self.min_group_size < 1:
            raise ValueError(f"trajectory.min_group_size must be >= 1 or null, got {self.min_group_size}")
        if self.group_weight not in GROUP_WEIGHTS:
            raise ValueError(f"trajectory.group_weight must be one of {GROUP_WEIGHTS}, got {self.group_weight!r}")

    def value_options(self) -> dict[str, Any]:
        """The options of ``cua_rl.trajectory.episode_values`` this section sets (what each episode trains with)."""
        return dict(normalise=self.normalise_in_group, scale_by_std=self.scale_by_std,
                    equal_episode_weight=self.equal_episode_weight, group_weight=self.group_weight)

    def row_options(self) -> dict[str, Any]:
        """The options of ``cua_rl.trajectory.group_rows`` this section sets (how turns become rows)."""
        return dict(style=self.export_style, discount=self.turn_discount)

    def group_options(self) -> dict[str, Any]:
        """Both, for ``cua_rl.trajectory.build_group`` / ``group_batch``."""
        return {**self.value_options(), **self.row_options()}
