"""Turn records + rewards -> AReaL tensor dicts (``multi_modal_input`` included), one GRPO group at a time."""

from .groups import (
                     GROUP_WEIGHTS,
                     EpisodeOutcome,
                     GroupRows,
                     ScreenshotSwap,
                     build_group,
                     episode_values,
                     episode_weights,
                     group_batch,
                     group_rows,
                     normalise_group,
                     shuffle_rewards,
                     trained_tokens,
                     value_bound,
)
from .rows import ExportStyle, concat_row, episode_rows, is_prefix_chain, rows_of, turn_rewards, turn_row

__all__ = ["EpisodeOutcome", "GROUP_WEIGHTS", "GroupRows", "ScreenshotSwap", "build_group", "episode_values",
           "episode_weights", "group_batch", "group_rows", "normalise_group", "shuffle_rewards", "trained_tokens",
           "value_bound", "ExportStyle", "episode_rows", "turn_row", "concat_row", "is_prefix_chain", "rows_of",
           "turn_rewards"]
