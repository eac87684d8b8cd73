"""Pluggable agent prompt formats, selected by the run payload's ``agent`` field.

Add a format by subclassing :class:`PromptFormat` and decorating it with :func:`register_format`.
"""

from . import keyboard, mai_ui, qwen3_vl  # noqa: F401  (registers the built-in formats)
from .base import HistoryStep, PromptContext, PromptFormat, format_names, get_format, register_format

__all__ = ["HistoryStep", "PromptContext", "PromptFormat", "format_names", "get_format", "register_format"]
