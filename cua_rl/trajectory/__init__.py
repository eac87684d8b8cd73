"""Turn records + rewards -> AReaL tensor dicts (``multi_modal_input`` included), one GRPO group at a time."""

from .groups import EpisodeOutcome, ScreenshotSwap, episode_weights, group_batch, normalise_group, shuffle_rewards
from .rows import ExportStyle, concat_row, episode_rows, is_prefix_chain, rows_of, turn_rewards, turn_row

__all__ = ["EpisodeOutcome", "ScreenshotSwap", "episode_weights", "group_batch", "normalise_group", "shuffle_rewards", "ExportStyle", "episode_rows",
           "turn_row", "concat_row", "is_prefix_chain", "rows_of", "turn_rewards"]
