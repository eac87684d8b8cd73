"""Typed builders for Training Monitor ingest records (docs/protocols.md §4.1).

Why builders: the monitor upserts by ``client_id``, so the id conventions must be identical at every
call site (start, updates, completion of a rollout all hit the same row), and several columns are
JSON *strings*, not objects. ``None`` fields are dropped so a partial update never blanks a column.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

KINDS = ("tasks", "validators", "environments", "steps", "baselines", "evals", "rollouts", "turns", "actions",
         "observations", "validations")
SOURCE_TYPES = ("step", "eval", "baseline")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _json_str(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


@dataclass(frozen=True)
class Record:
    """One row of one kind; ``to_payload`` is what goes into the batch array of that kind."""

    kind: str
    client_id: str
    fields: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown monitor record kind {self.kind!r}; expected one of {KINDS}")
        if not self.client_id:
            raise ValueError("monitor records need a client_id")

    def to_payload(self) -> dict:
        return {"client_id": self.client_id, **{k: v for k, v in self.fields.items() if v is not None}}


def training_start(experiment_name: str, trial_name: str, *, started_at: datetime | None = None) -> dict:
    """The ``training`` object that opens a run; the reply carries its ``training_id``."""
    stamp = (started_at or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return {"run_name": f"{experiment_name}_{trial_name}_{stamp}", "status": "running",
            "current_phase": "rollout", "experiment_name": experiment_name, "trial_name": trial_name}


def training_end(training_id: int, status: str = "completed") -> dict:
    return {"training_id": training_id, "status": status, "current_phase": "done"}


def task_record(task_id: str, name: str, description: str = "", source_type: str = "gym") -> Record:
    return Record("tasks", str(task_id), {"task_id": str(task_id), "name": name, "description": description,
                                          "source_type": source_type})


def step_record(training_id: int, step: int, batch: int = 0, *, status: str = "running",
                current_phase: str | None = "rollout", start_time: str | None = None, **extra: Any) -> Record:
    """client_id ``step-{training_id}-{step}-{batch}``."""
    return Record("steps", f"step-{training_id}-{step}-{batch}",
                  {"training_id": training_id, "step": step, "batch": batch, "status": status,
                   "current_phase": current_phase, "start_time": start_time or now_iso(), **extra})


# The trainer's statistics the run page draws per update (AReaL's names; sampler_logprob_gap and entropy_bonus are
# ours). behave_kl: the policy that sampled the rows against the trainer's weights when they were trained (rows
# sampled before the last update); kl_reward: the KL penalty to the reference model (actor.kl_ctl > 0);
# entropy_bonus: the entropy term subtracted from the loss (entropy_bonus > 0).
UPDATE_STATS = {"loss": "ppo_actor/update/actor_loss/avg", "entropy": "ppo_actor/update/entropy/avg",
                "approx_kl": "ppo_actor/update/approx_kl/avg", "clip_ratio": "ppo_actor/update/clip_ratio/avg",
                "grad_norm": "ppo_actor/update/grad_norm", "lr": "ppo_actor/update/lr",
                "sampler_logprob_gap": "sampler_logprob_gap", "behave_kl": "ppo_actor/update/behave_approx_kl/avg",
                "kl_reward": "ppo_actor/kl_rewards/avg", "entropy_bonus": "ppo_actor/update/entropy_bonus/avg"}


def update_record(training_id: int, step: int, *, train_step: int, stats: dict[str, float],
                  health: dict[str, float], anomalies: list[dict]) -> Record:
    """What the trainer did with the rollouts sampled at policy version ``step`` (the monitor's step row):
    training step ``train_step`` (AReaL's 1-based count, which makes version ``train_step``), its statistics
    (``UPDATE_STATS``, those present), every health value and the checks it tripped (``anomalies``: name,
    value, threshold, action, line). Kept in the step row's ``extra`` as ``update``."""
    picked = {name: float(stats[key]) for name, key in UPDATE_STATS.items()
              if isinstance(stats.get(key), (int, float)) and math.isfinite(stats[key])}
    return Record("steps", f"step-{training_id}-{step}-0", {
        "training_id": training_id, "step": step, "batch": 0,
        "update": {"train_step": train_step, "stats": picked,
                   "health": {k: float(v) for k, v in health.items() if math.isfinite(v)},
                   "anomalies": anomalies}})


def rollout_record(rollout_uuid: str, *, status: str = "running", current_phase: str | None = None,
                   source_type: str = "step", step_id: int | None = None, task_id: str | None = None,
                   env_id: str | None = None, is_eval: bool | None = None, batch: int | None = None,
                   group_num: int | None = None, env_index: int | None = None, group_id: str | None = None,
                   max_turns: int | None = None, model_path: str | None = None, **extra: Any) -> Record:
    """Start or update of one rollout; client_id = ``rollout_uuid`` (hex). Re-send to update the row."""
    if source_type not in SOURCE_TYPES:
        raise ValueError(f"rollout source_type must be one of {SOURCE_TYPES}, got {source_type!r}")
    return Record("rollouts", rollout_uuid, {
        "rollout_id": rollout_uuid, "source_type": source_type, "step_id": step_id, "task_id": task_id,
        "env_id": env_id, "is_eval": is_eval, "batch": batch, "group_num": group_num, "env_index": env_index,
        "group_id": group_id, "max_turns": max_turns, "model_path": model_path, "status": status,
        "current_phase": current_phase, **extra})


def rollout_result(rollout_uuid: str, *, reward: float, task_success: bool, num_turns: int,
                   validation_passed: bool | None = None, summary: dict | None = None,
                   status: str = "completed", **identity: Any) -> Record:
    """Completion of a rollout: end time, reward, and ``summary_json`` as a JSON string."""
    return rollout_record(rollout_uuid, status=status, end_time=now_iso(), reward=reward,
                          task_success=task_success, num_turns=num_turns,
                          validation_passed=task_success if validation_passed is None else validation_passed,
                          summary_json=_json_str(summary), **identity)


def turn_record(rollout_uuid: str, turn: int, *, rollout_id: int | str, start_time: str | None = None,
                end_time: str | None = None, turn_time: float | None = None, thinking: str | None = None,
                text: str | None = None, action: dict | None = None, model_input: dict | None = None,
                metrics: dict | None = None, screen_before: str | None = None, screen_after: str | None = None,
                reward: float | None = None, episode_done: bool | None = None, advantage: float | None = None,
                image_sha256: str | None = None, tokens: dict | None = None) -> Record:
    """One turn (1-based); client_id ``{rollout_uuid}:turn:{turn}``. ``rollout_id`` is the monitor's id
    for the rollout (from the ingest reply), else the uuid. Object fields become JSON strings.
    ``image_sha256`` names the screenshot the model saw (uploaded with ``put_blob``); ``tokens`` is
    ``{"ids", "pieces", "logprobs", "trainer_logprobs"?, "versions"}`` of the model's output."""
    model_response = None if end_time is None else {"thinking": thinking, "text": text, "action": action}
    return Record("turns", turn_client_id(rollout_uuid, turn), {
        "rollout_id": rollout_id, "turn": turn, "start_time": start_time, "end_time": end_time,
        "turn_time": turn_time, "reward": reward, "advantage": advantage, "episode_done": episode_done,
        "model_response": _json_str(model_response), "screen_before": screen_before,
        "screen_after": screen_after, "thinking": thinking, "text": text, "action_json": _json_str(action),
        "model_specific_input_json": _json_str(model_input), "metrics_json": _json_str(metrics),
        "image_sha256": image_sha256, "tokens_json": _json_str(tokens)})


def turn_client_id(rollout_uuid: str, turn: int) -> str:
    return f"{rollout_uuid}:turn:{turn}"


def trainer_logprobs_record(rollout_uuid: str, turn: int, logprobs: list[float],
                            version: int | None = None) -> Record:
    """The trainer's recomputed logprobs of a turn's output tokens, and the trainer's policy ``version`` when
    it computed them: a turn sampled at an older version differs by the updates since, not by a defect.
    Sent by the trainer, which knows the turn only by its client_id: the fields are not in the turn schema,
    so the monitor keeps them in the row's ``extra`` (merged, so the rollout worker's turn record and this
    one may arrive in either order)."""
    fields: dict = {"trainer_logprobs": [round(float(x), 5) for x in logprobs]}
    if version is not None:
        fields["trainer_version"] = int(version)
    return Record("turns", turn_client_id(rollout_uuid, turn), fields)


def action_record(rollout_uuid: str, turn: int, index: int, *, turn_id: int | str, name: str,
                  args: dict | None = None, call_id: str | None = None, action: dict | None = None) -> Record:
    """One action of a turn; client_id ``{rollout_uuid}:turn:{turn}:action:{index}``. ``action`` is the
    executed (gym) action, e.g. ``{"type": "click", "x": 0.5, "y": 0.2}`` in screen fractions."""
    return Record("actions", f"{turn_client_id(rollout_uuid, turn)}:action:{index}", {
        "turn_id": turn_id, "action_type": (action or {}).get("type") or name, "action_name": name,
        "action_args": args, "action_call_id": call_id, "action_json": _json_str(action)})


def observation_record(rollout_uuid: str, turn: int, obs_type: str, *, turn_id: int | str,
                       screenshot_uri: str | None = None, model_input: dict | None = None) -> Record:
    """``screenshot_before`` / ``screenshot_after`` / ``model_input`` of a turn."""
    return Record("observations", f"{turn_client_id(rollout_uuid, turn)}:{obs_type}", {
        "turn_id": turn_id, "obs_type": obs_type, "screenshot_uri": screenshot_uri,
        "model_input_json": _json_str(model_input)})


def eval_record(training_id: int, step: int, *, baseline: bool = False, model_path: str | None = None,
                status: str = "running", start_time: str | None = None, **extra: Any) -> Record:
    """An evaluation of the policy at ``step`` (client_id ``eval-{training_id}-{step}``), or the baseline
    (the base model before training, ``baseline-{training_id}-{step}``)."""
    kind, prefix = ("baselines", "baseline") if baseline else ("evals", "eval")
    return Record(kind, f"{prefix}-{training_id}-{step}", {
        "training_id": training_id, "step": step, "model_path": model_path, "status": status,
        "start_time": start_time or now_iso(), **extra})


def validation_record(rollout_uuid: str, *, rollout_id: int | str, reward: float, success: bool,
                      num_validators: int, details: dict | None = None, validator_id: str | None = None,
                      validation_query: str | None = None, expected_result: str | None = None,
                      execution_time: float | None = None, error_message: str | None = None,
                      screenshot_uri: str | None = None) -> Record:
    """The gym's verdict on a rollout; client_id ``{rollout_uuid}:validation`` (one per rollout)."""
    return Record("validations", f"{rollout_uuid}:validation", {
        "rollout_id": rollout_id, "validator_id": validator_id, "validation_time": now_iso(),
        "validation_query": validation_query, "expected_result": expected_result,
        "actual_result": f"reward={reward:.4f}, validators={num_validators}", "success": success,
        "execution_time": execution_time, "error_message": error_message, "details_json": details,
        "screenshot_uri": screenshot_uri})
