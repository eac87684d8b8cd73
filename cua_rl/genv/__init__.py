"""Async client of a genv gym server: tasks, executions, evaluation and the reward they are worth."""

from .client import GenvClient, GenvTimeouts
from .errors import GenvError
from .models import DIFFICULTY_TAGS, Execution, Fork, Task, difficulty_from_tags
from .reward import Evaluation, ValidatorResult, extract_reward

__all__ = ["GenvClient", "GenvTimeouts", "GenvError", "Task", "Execution", "Fork", "Evaluation", "ValidatorResult",
           "extract_reward", "difficulty_from_tags", "DIFFICULTY_TAGS"]
