"""The trainer's recomputed logprobs of each turn, sent to the Training Monitor beside the engine's.

Why: the viewer colours each output token by |trainer - engine| logprob, which is where a wrong image, a
shifted mask or a stale weight update shows. The engine's logprobs travel with the turn from the rollout
worker; the trainer's exist only inside the training worker, after ``compute_logp``. Training rows carry
``monitor_turn`` (``trajectory/rows.py``): per token the ``turn_key`` of the turn it was generated in, so
this module can name the turn of each recomputed logprob without any other channel.

``enable()`` (called by ``cua_rl.areal_ext.worker`` in AReaL's training worker) wraps ``PPOActor.compute_logp``:
after AReaL computes the logprobs, their per-turn values are queued and a daemon thread posts them, so
training never waits on the monitor; a full queue drops (and counts) batches. Only the policy's logprobs
are sent: a reference or teacher model (an engine without an optimizer) computes logprobs too. Settings come from the
environment the launcher's ``train.py`` sets for the workers: ``MONITOR_BASE_URL``, ``PROJECT_ID`` and the
token (``PROJECT_TOKEN``); without them nothing is wrapped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from typing import Any

import torch

from cua_rl.monitor.client import MonitorClient, token_from_env
from cua_rl.monitor.records import Record, trainer_logprobs_record
from cua_rl.trajectory.rows import TURN_KEY_ROW, turn_of_key

logger = logging.getLogger(__name__)

_QUEUE_BATCHES = 64          # compute_logp calls waiting to be sent; more are dropped and counted
_RECORDS_PER_POST = 200      # records per ingest request (the monitor refuses batches over 5000 rows)


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


def records_of(by_turn: dict[int, list[float]]) -> list[Record]:
    return [trainer_logprobs_record(*turn_of_key(key), values) for key, values in by_turn.items()]


class TrainerLogprobSender:
    """One daemon thread posting queued records; ``sent``, ``failures`` and ``dropped`` count batches."""

    def __init__(self, client_factory, timeout_s: float = 10.0) -> None:
        self._client_factory = client_factory
        self.timeout_s = timeout_s
        self._queue: queue.Queue[list[Record] | None] = queue.Queue(maxsize=_QUEUE_BATCHES)
        self.sent = self.failures = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="monitor-trainer-logprobs", daemon=True)
        self._thread.start()

    def submit(self, records: list[Record]) -> None:
        if not records:
            return
        try:
            self._queue.put_nowait(records)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("training monitor: trainer logprobs queue full; dropping batches (training is "
                               "not affected)")

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (bounded by ``timeout_s``) and stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            records = self._queue.get()
            if records is None:
                return
            try:
                asyncio.run(self._post(records))
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - the monitor only observes
                self.failures += 1
                log = logger.warning if self.failures == 1 else logger.debug
                log("training monitor: trainer logprobs not sent (%d failures): %s: %s", self.failures,
                    type(exc).__name__, exc)

    async def _post(self, records: list[Record]) -> None:
        async with self._client_factory() as client:
            for i in range(0, len(records), _RECORDS_PER_POST):
                await asyncio.wait_for(client.upsert(*records[i:i + _RECORDS_PER_POST]), 3 * self.timeout_s)


_sender: TrainerLogprobSender | None = None


def wrap_compute_logp(compute_logp, sender: TrainerLogprobSender):
    """``compute_logp`` that also submits each result's per-turn values to ``sender``."""

    def compute_logp_and_report(self, data, *args, **kwargs):
        logps = compute_logp(self, data, *args, **kwargs)
        if getattr(getattr(self, "engine", None), "optimizer", None) is None:
            return logps  # a reference or teacher model (no optimizer): not the policy being trained
        try:
            sender.submit(records_of(turn_logprobs(data, logps)))
        except Exception as exc:  # noqa: BLE001 - never break a training step for the viewer
            logger.warning("training monitor: trainer logprobs not reported: %s: %s", type(exc).__name__, exc)
        return logps

    compute_logp_and_report.__wrapped__ = compute_logp
    return compute_logp_and_report


def enable() -> bool:
    """Report trainer logprobs from this process when the monitor settings are in the environment."""
    global _sender
    if _sender is not None:
        return True
    if not (os.environ.get("MONITOR_BASE_URL") and token_from_env()):
        return False
    from areal.trainer.ppo.actor import PPOActor

    _sender = TrainerLogprobSender(lambda: MonitorClient.from_env(raise_errors=True))
    PPOActor.compute_logp = wrap_compute_logp(PPOActor.compute_logp, _sender)
    logger.info("training monitor: the trainer's recomputed logprobs are sent per turn")
    return True
