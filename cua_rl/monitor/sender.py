"""A daemon thread that posts Training Monitor records queued by code that must never wait on the monitor:
the training worker's recomputed logprobs per turn (``cua_rl.areal_ext.trainer_logprobs``) and the trainer's
statistics and health after each update (``cua_rl.trainer.trainer``).

Why a thread with a bounded queue: both run inside AReaL's training loop, where a slow or down monitor must
cost nothing. A full queue drops (and counts) batches; a failed post is counted and logged once.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from .records import Record

logger = logging.getLogger(__name__)

_QUEUE_BATCHES = 64          # submitted batches waiting to be sent; more are dropped and counted
_RECORDS_PER_POST = 200      # records per ingest request (the monitor refuses batches over 5000 rows)


class RecordSender:
    """One daemon thread posting queued records; ``sent``, ``failures`` and ``dropped`` count batches.
    ``client_factory()`` returns an async-context ``MonitorClient`` with ``raise_errors=True``; ``what``
    names the records in log lines."""

    def __init__(self, client_factory, *, what: str, timeout_s: float = 10.0) -> None:
        self._client_factory = client_factory
        self.what, self.timeout_s = what, timeout_s
        self._queue: queue.Queue[list[Record] | None] = queue.Queue(maxsize=_QUEUE_BATCHES)
        self.sent = self.failures = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"monitor-{what.replace(' ', '-')}", daemon=True)
        self._thread.start()

    def submit(self, records: list[Record]) -> None:
        if not records:
            return
        try:
            self._queue.put_nowait(records)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("training monitor: %s queue full; dropping batches (training is not affected)",
                               self.what)

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
                log("training monitor: %s not sent (%d failures): %s: %s", self.what, self.failures,
                    type(exc).__name__, exc)

    async def _post(self, records: list[Record]) -> None:
        async with self._client_factory() as client:
            for i in range(0, len(records), _RECORDS_PER_POST):
                await asyncio.wait_for(client.upsert(*records[i:i + _RECORDS_PER_POST]), 3 * self.timeout_s)
