"""The trainer's recomputed logprobs of each turn: their gap to the engine's in every step's statistics, and
each turn's values sent to the Training Monitor beside the engine's.

Why: the viewer colours each output token by |trainer - engine| logprob, which is where a wrong image, a
shifted mask or a stale weight update shows. The engine's logprobs travel with the turn from the rollout
worker; the trainer's exist only inside the training worker, after ``compute_logp``. Training rows carry
``monitor_turn`` (``trajectory/rows.py``): per token the ``turn_key`` of the turn it was generated in, so
this module can name the turn of each recomputed logprob without any other channel.

``enable()`` (called by ``cua_rl.areal_ext.worker`` in AReaL's training worker) wraps ``PPOActor.compute_logp``.
After AReaL computes the policy's logprobs (a reference or teacher model, an engine without an optimizer,
computes logprobs too; those are left alone):

- the mean |trainer - engine| logprob over the trained tokens sampled at the trainer's own policy version
  goes into the step's statistics as ``SAMPLER_GAP_KEY``, always: for those tokens the weights the engine
  sampled with and the trainer's must be the same (a gap of about 1e-3 here on the CPU, a few 1e-2 in bf16
  on a GPU), so a large gap means the engine serves other weights (an update that never reached it,
  another model) or scores other inputs (an image or prompt the trainer does not see). AReaL labels tokens
  with the version it believes the engine serves, so an ignored update shows here and nowhere else. The
  health check ``sampler_logprob_gap`` (``cua_rl.trainer.health``) reads it;
- with the Training Monitor on, the per-turn values (and the trainer's version: a turn sampled at an older
  one also differs by the updates since) are queued and a daemon thread posts them, so training
  never waits on the monitor; a full queue drops (and counts) batches. Settings come from the environment
  the launcher's ``train.py`` sets for the workers: ``MONITOR_BASE_URL``, ``PROJECT_ID`` and the token
  (``PROJECT_TOKEN``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from cua_rl.areal_ext import SAMPLER_GAP_KEY
from cua_rl.monitor.client import MonitorClient, token_from_env
from cua_rl.monitor.records import Record, trainer_logprobs_record
from cua_rl.monitor.sender import RecordSender
from cua_rl.trajectory.rows import TURN_KEY_ROW, turn_of_key

logger = logging.getLogger(__name__)


def turn_logprobs(data: list[dict[str, Any]], logps: list[torch.Tensor] | None) -> dict[int, list[float]]:
    """``turn_key -> trainer logprobs of that turn's output tokens`` for the rows of one ``compute_logp``
    call. ``logp[t]`` scores token ``t + 1`` (AReaL's convention), so token ``j`` reads ``logp[j - 1]``.
    Rows without ``monitor_turn`` and tokens whose key is 0 are skipped."""
    out: dict[int, list[float]] = {}
    for batch, logp in zip(data, logps or []):
        keys = batch.get(TURN_KEY_ROW) if isinstance(batch, dict) else None
        if keys is None or logp is None:
            continue
        mask = batch["loss_mask"].bool() & (keys > 0)
        scored = torch.roll(logp.detach().float().cpu(), 1, dims=-1)
        for row in range(keys.shape[0]):
            positions = mask[row].nonzero().flatten()
            for key, value in zip(keys[row, positions].tolist(), scored[row, positions].tolist()):
                out.setdefault(key, []).append(value)
    return out


def sampler_gap(data: list[dict[str, Any]], logps: list[torch.Tensor] | None,
                version: int | None = None) -> tuple[float, int]:
    """(sum of |trainer - engine| logprob, number of tokens) over the trained tokens of one ``compute_logp``
    call, aligned as ``turn_logprobs`` aligns them; rows without the engine's ``logprobs`` are skipped.
    ``version``: only tokens sampled at that policy version (the trainer's own: on-policy tokens, whose gap
    is numerics alone; older tokens also differ by the updates since, which off-policy training allows)."""
    total, count = 0.0, 0
    for batch, logp in zip(data, logps or []):
        if not isinstance(batch, dict) or logp is None or "logprobs" not in batch:
            continue
        mask = batch["loss_mask"].bool()
        if version is not None and "versions" in batch:
            mask = mask & (batch["versions"] == version)
        scored = torch.roll(logp.detach().float().cpu(), 1, dims=-1)
        diff = (scored[mask.cpu()] - batch["logprobs"].float().cpu()[mask.cpu()]).abs()
        total, count = total + float(diff.sum()), count + int(diff.numel())
    return total, count


def records_of(by_turn: dict[int, list[float]], version: int | None = None) -> list[Record]:
    """One record per turn; ``version``: the trainer's policy version when it computed them."""
    return [trainer_logprobs_record(*turn_of_key(key), values, version) for key, values in by_turn.items()]


_sender: RecordSender | None = None


def wrap_compute_logp(compute_logp, sender: RecordSender | None):
    """``compute_logp`` that also records the sampler gap and submits each result's per-turn values to
    ``sender`` (None: the monitor is off)."""

    def compute_logp_and_report(self, data, *args, **kwargs):
        logps = compute_logp(self, data, *args, **kwargs)
        if getattr(getattr(self, "engine", None), "optimizer", None) is None:
            return logps  # a reference or teacher model (no optimizer): not the policy being trained
        version = None
        try:
            version = self.engine.get_version()
            total, count = sampler_gap(data, logps, version)
            if count:
                from areal.utils import stats_tracker

                stats_tracker.scalar(**{SAMPLER_GAP_KEY: total / count})
        except Exception as exc:  # noqa: BLE001 - a statistic never breaks a training step
            logger.warning("sampler gap not recorded: %s: %s", type(exc).__name__, exc)
        if sender is None:
            return logps
        try:
            sender.submit(records_of(turn_logprobs(data, logps), version))
        except Exception as exc:  # noqa: BLE001 - never break a training step for the viewer
            logger.warning("training monitor: trainer logprobs not reported: %s: %s", type(exc).__name__, exc)
        return logps

    compute_logp_and_report.__wrapped__ = compute_logp
    return compute_logp_and_report


_enabled = False


def enable() -> bool:
    """Record the sampler gap in this process; also report trainer logprobs when the monitor settings are in
    the environment (returns whether they are)."""
    global _sender, _enabled
    if _enabled:
        return _sender is not None
    from areal.trainer.ppo.actor import PPOActor

    if os.environ.get("MONITOR_BASE_URL") and token_from_env():
        _sender = RecordSender(lambda: MonitorClient.from_env(raise_errors=True), what="trainer logprobs")
        logger.info("training monitor: the trainer's recomputed logprobs are sent per turn")
    PPOActor.compute_logp = wrap_compute_logp(PPOActor.compute_logp, _sender)
    _enabled = True
    return _sender is not None
