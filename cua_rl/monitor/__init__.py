"""Training Monitor ingest client and typed record builders (disabled without settings)."""

from .client import IngestResult, MonitorClient, MonitorError, token_from_env
from .records import (
    KINDS,
    SOURCE_TYPES,
    Record,
    action_record,
    eval_record,
    now_iso,
    observation_record,
    rollout_record,
    rollout_result,
    step_record,
    task_record,
    training_end,
    training_start,
    turn_record,
    validation_record,
)
from .reporter import EpisodeReporter, RolloutReport, training_run

__all__ = ["IngestResult", "MonitorClient", "MonitorError", "KINDS", "SOURCE_TYPES", "Record", "now_iso",
           "rollout_record", "action_record", "eval_record", "observation_record", "rollout_result", "step_record",
           "task_record", "training_end", "training_start",
           "turn_record", "validation_record", "EpisodeReporter", "RolloutReport", "training_run",
           "token_from_env"]
