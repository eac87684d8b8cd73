"""Monitor reporting for a training run: ``training_run`` (trainer, rank 0) and ``EpisodeReporter``
(rollout workers).

Why fire-and-forget: the monitor only observes. An episode must never wait on it or fail because of it,
so every send runs as a background task on the worker's loop with a short timeout, and the first failure
is logged (later ones only at DEBUG). Sends for one rollout are chained so that its completion can never
overtake its start (the monitor upserts by ``client_id``; a late start would reset the row to running).
The token is read from the environment here, never passed through workflow kwargs (AReaL may log or
save those). Disabled (no base URL or no token) means no task and no HTTP at all.

Each turn is sent as soon as the policy endpoint records it (screenshot uploaded first by hash, the
model's text and token logprobs), so a running rollout plays in the viewer; once the episode is evaluated
its turns are sent again with what only the agent knows (parsed actions, thinking, invalid replies) and
the rewards; the group's advantages follow once the group is complete. The run
needs nothing back from the monitor, so while it is down records are dropped, never retried forever:
``failures`` counts failed sends and ``dropped`` the sends refused because ``MAX_PENDING`` were already
queued (a monitor that hangs must not hold every episode's screenshots in memory).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

from ..http.retry import RetryPolicy
from .client import MonitorClient, token_from_env
from .records import (
    Record,
    action_record,
    eval_record,
    now_iso,
    observation_record,
    rollout_record,
    rollout_result,
    step_record,
    task_record,
    training_start,
    turn_client_id,
    turn_record,
    validation_record,
)
from .turns import TurnView, turn_advantages, turn_views

logger = logging.getLogger(__name__)

# Short on purpose: a monitor that does not answer within seconds is skipped, not waited for.
SEND_TIMEOUT_S = 10.0
_RETRY = RetryPolicy(attempts=2, backoff_s=0.5, max_backoff_s=1.0, retry_5xx=False)  # training start/end
# Episodes: one try per record. A retry would log a warning per episode while the monitor is down, and the
# next record of the rollout re-sends its identity anyway (upsert by client_id).
_EPISODE_RETRY = RetryPolicy(attempts=1, retry_5xx=False)
MAX_PENDING = 512           # queued sends per reporter; more are dropped (and counted) until the queue drains
_UPLOADED_MEMORY = 4096     # screenshot hashes this reporter remembers having uploaded


@contextmanager
def training_run(base_url: str, project_id: str | None, experiment_name: str, trial_name: str, *,
                 token: str, enabled: bool = True, timeout_s: float = SEND_TIMEOUT_S,
                 config: dict | None = None) -> Iterator[int | None]:
    """Post the ``training`` record, yield its id (None when disabled or unreachable), and mark it
    ``completed`` on a clean exit or ``failed`` on any exception (then re-raised). Synchronous: the
    trainer's entry point has no event loop. ``enabled=False`` (other ranks) sends nothing. ``config``
    (the run's resolved configuration) is shown on the run page; secrets in it are masked."""
    if not (enabled and base_url and token):
        yield None
        return

    async def send(method: str, *args: Any) -> Any:
        async with MonitorClient.from_settings(base_url, token, project_id, timeout_s=timeout_s,
                                               retry=_RETRY) as monitor:
            return await getattr(monitor, method)(*args)

    def call(method: str, *args: Any) -> Any:
        try:  # the client logs its own failures; this catches what it does not expect (a malformed URL...)
            return asyncio.run(send(method, *args))
        except Exception as exc:  # noqa: BLE001 - never mask or cause a training failure
            logger.warning("training monitor %s failed: %s: %s", method, type(exc).__name__, exc)
            return None

    start = training_start(experiment_name, trial_name)
    if config is not None:
        start["config_json"] = json.dumps(_mask_secrets(config), default=str)
    training_id = call("start_training", start)
    status = "failed"
    try:
        yield training_id
        status = "completed"
    finally:
        if training_id is not None:
            call("finish_training", training_id, status)


class EpisodeReporter:
    """Background sends of task, step, rollout and validation records for one rollout worker's loop."""

    def __init__(self, base_url: str, project_id: str | None, training_id: int | None, *,
                 token: str | None = None, timeout_s: float = SEND_TIMEOUT_S, retry: RetryPolicy = _EPISODE_RETRY):
        self.client = MonitorClient.from_settings(base_url, token_from_env() if token is None else token,
                                                  project_id, timeout_s=timeout_s, retry=retry, raise_errors=True)
        self.enabled = self.client.enabled
        self.training_id = training_id
        self.timeout_s = timeout_s
        self.failures = 0
        self.dropped = 0
        self._uploaded: dict[str, None] = {}          # screenshot hashes already sent (insertion-ordered)
        self._blobs_supported = True
        self._ids: dict[str, asyncio.Task] = {}       # "task:<id>" / "step:<n>" -> task giving the monitor id
        self._chains: dict[str, asyncio.Task] = {}    # rollout uuid -> its last queued send
        self._pending: set[asyncio.Task] = set()

    # ---- what the workflow calls (all return at once) -------------------------------------------------
    def rollout(self, rollout_uuid: str, *, task_id: str, task_name: str = "", task_description: str = "",
                step: int | None = None, **identity: Any) -> "RolloutReport":
        """Queue the task record (once per task), the step record (once per step) and the rollout's
        start; returns the handle that reports its end."""
        report = RolloutReport(self, rollout_uuid, identity)
        if not self.enabled:
            return report

        async def start() -> list[Record]:
            remote_task = await self._once(f"task:{task_id}", task_record(task_id, task_name or task_id,
                                                                          task_description), "tasks")
            report.identity.update(task_id=remote_task, training_id=self.training_id)
            if self.training_id is not None and step is not None:
                report.identity.update(await self._parent(step, bool(identity.get("is_eval"))))
            return [rollout_record(rollout_uuid, status="running", current_phase="env_creation",
                                   start_time=now_iso(), **report.identity)]

        self._chain(rollout_uuid, start, lambda result: report._started(result.id_of("rollouts", rollout_uuid)))
        return report

    async def _parent(self, step: int, is_eval: bool) -> dict[str, Any]:
        """The rollout's step, or for an evaluation its eval (the baseline at policy version 0: the base
        model before any update)."""
        if not is_eval:
            return {"step_id": await self._once(f"step:{step}", step_record(self.training_id, step), "steps"),
                    "source_type": "step"}
        baseline = step == 0
        record = eval_record(self.training_id, step, baseline=baseline)
        kind = record.kind
        parent = await self._once(f"{kind}:{step}", record, kind)
        return {("baseline_id" if baseline else "eval_id"): parent, "source_type": "baseline" if baseline else "eval"}

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for queued sends; for tests and shutdown, never called inside an episode."""
        pending = set(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s if timeout_s is not None else 3 * self.timeout_s)

    async def aclose(self) -> None:
        await self.flush()
        await self.client.aclose()

    # ---- machinery ------------------------------------------------------------------------------------
    def _chain(self, key: str, build: Callable[[], Awaitable[list[Record]]],
               on_result: Callable[[Any], None] | None = None) -> None:
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("training monitor: %d sends queued; dropping further records until it catches up "
                               "(training is not affected)", MAX_PENDING)
            return
        previous = self._chains.get(key)
        task = asyncio.get_running_loop().create_task(self._send_after(previous, build, on_result))
        self._chains[key] = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(lambda t: self._chains.pop(key, None) if self._chains.get(key) is t else None)

    async def _send_after(self, previous: asyncio.Task | None, build: Callable[[], Awaitable[list[Record]]],
                          on_result: Callable[[Any], None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            records = await build()
            result = await asyncio.wait_for(self.client.upsert(*records), 3 * self.timeout_s)
            if on_result is not None:
                on_result(result)
        except Exception as exc:  # noqa: BLE001 - the monitor must never break an episode
            self._failed(exc)

    async def _once(self, key: str, record: Record, kind: str) -> Any:
        """The monitor id of a record sent once per reporter; None (and retried next time) on failure."""
        task = self._ids.get(key)
        if task is None:
            task = self._ids[key] = asyncio.get_running_loop().create_task(self._send_one(record, kind))
        rid = await asyncio.shield(task)
        if rid is None and self._ids.get(key) is task:
            self._ids.pop(key)
        return rid

    async def _send_one(self, record: Record, kind: str) -> Any:
        try:
            result = await asyncio.wait_for(self.client.upsert(record), 3 * self.timeout_s)
            return result.id_of(kind, record.client_id)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return None

    async def _upload_screenshots(self, views: list[TurnView]) -> None:
        """Each screenshot once per reporter; a failed upload leaves the turn's hash without a file."""
        for view in views:
            sha = view.image_sha256
            if view.screenshot is None or sha is None or sha in self._uploaded or not self._blobs_supported:
                continue
            try:
                await asyncio.wait_for(self.client.put_blob(view.screenshot, sha), 3 * self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - the turn itself is still worth sending
                self._failed(exc)
                if any(f"HTTP {code}" in str(exc) for code in (404, 405)):
                    self._blobs_supported = False   # a monitor without our blob store: send turns only
                continue
            self._uploaded[sha] = None
            if len(self._uploaded) > _UPLOADED_MEMORY:
                self._uploaded.pop(next(iter(self._uploaded)))

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        # MonitorError messages are already scrubbed of the token; others never contain it.
        message = f"{type(exc).__name__}: {exc}"
        if self.failures == 1:
            logger.warning("training monitor send failed (training continues; further monitor failures are "
                           "logged at DEBUG): %s", message)
        else:
            logger.debug("training monitor send failed (%d so far): %s", self.failures, message)


class RolloutReport:
    """One rollout's end, reported once: ``finished`` (evaluated), ``failed`` (dropped) or ``cancelled``."""

    def __init__(self, reporter: EpisodeReporter, rollout_uuid: str, identity: dict) -> None:
        self.reporter, self.uuid = reporter, rollout_uuid
        self.identity = {k: v for k, v in identity.items() if v is not None}
        self.closed = False
        self.remote_id: Any = None  # the monitor's id of the rollout row, once its start was answered

    def _started(self, remote_id: Any) -> None:
        self.remote_id = remote_id

    def turn(self, number: int, turn: Any, tokenizer: Any = None) -> None:
        """A turn the endpoint has just recorded (1-based ``number``), sent while the episode runs; the
        rollout row shows it as its current turn. Returns at once."""
        if self.closed or not self.reporter.enabled:
            return

        async def build() -> list[Record]:
            views = await asyncio.to_thread(turn_views, [turn], [], tokenizer, first=number)
            await self.reporter._upload_screenshots(views)
            rid = self.remote_id if self.remote_id is not None else self.uuid
            return [rollout_record(self.uuid, status=None, current_phase="agent", current_turn=number,
                                   **self.identity),
                    *turn_view_records(self.uuid, rid, views[0])]
        self.reporter._chain(self.uuid, build)

    def execution(self, execution_id: str, live_view: str | None = None) -> None:
        """The gym's execution of this rollout and, when the gym offers one (ours), the address of its live
        view: the rollout page links to it while the rollout runs. Returns at once."""
        if self.closed or not self.reporter.enabled:
            return
        fields = {"execution_id": execution_id, **({"live_view": live_view} if live_view else {})}
        self.reporter._chain(self.uuid, _async(lambda: [rollout_record(self.uuid, status=None, **fields,
                                                                       **self.identity)]))

    def finished(self, *, reward: float, task_success: bool, num_turns: int, summary: dict,
                 num_validators: int = 0, evaluation: dict | None = None, turns: list | None = None,
                 steps: list[dict] | None = None, tokenizer: Any = None, discount: float = 1.0) -> None:
        """The rollout's result and validation, then its turns (``turns``: the endpoint's ``Turn`` records,
        ``steps``: the agent's steps, ``tokenizer`` to show output tokens)."""
        if self._close():
            def build() -> list[Record]:
                rid = self.remote_id if self.remote_id is not None else self.uuid
                return [rollout_result(self.uuid, reward=reward, task_success=task_success, num_turns=num_turns,
                                       summary=summary, **self.identity),
                        validation_record(self.uuid, rollout_id=rid, reward=reward, success=task_success,
                                          num_validators=num_validators,
                                          details={"genv_evaluation": evaluation, "reward": reward,
                                                   "task_id": summary.get("task_id"),
                                                   "execution_id": summary.get("execution_id")})]
            self.reporter._chain(self.uuid, _async(build))
            if turns:
                self.reporter._chain(self.uuid, lambda: self._turn_records(turns, steps or [], tokenizer, reward,
                                                                           discount))

    async def _turn_records(self, turns: list, steps: list[dict], tokenizer: Any, reward: float,
                            discount: float) -> list[Record]:
        views, rewards = await asyncio.to_thread(
            lambda: (turn_views(turns, steps, tokenizer), turn_advantages(reward, len(turns), discount)))
        await self.reporter._upload_screenshots(views)
        rid = self.remote_id if self.remote_id is not None else self.uuid
        records: list[Record] = []
        for view, turn_reward in zip(views, rewards):
            records += turn_view_records(self.uuid, rid, view, reward=turn_reward, last=view.turn == len(views))
        return records

    def advantage(self, value: float, num_turns: int, discount: float = 1.0, first_turn: int = 1) -> None:
        """The rollout's GRPO advantage (its group-normalised reward) and each turn's share of it; ``first_turn``:
        the rollout's turn the ``num_turns`` start at (a tree path's later segment; its value is then the
        rollout's advantage until a later segment's comes)."""
        if not self.reporter.enabled or num_turns < 0:
            return

        def build() -> list[Record]:
            rid = self.remote_id if self.remote_id is not None else self.uuid
            out = [rollout_record(self.uuid, status=None, advantage=value, **self.identity)]  # keeps its status
            out += [turn_record(self.uuid, first_turn + i, rollout_id=rid, advantage=a)
                    for i, a in enumerate(turn_advantages(value, num_turns, discount))]
            return out
        self.reporter._chain(self.uuid, _async(build))

    def failed(self, error: str, summary: dict | None = None, *, status: str = "failed") -> None:
        """The rollout ended without a reward: ``failed`` (dropped: ``error`` says why) or, with ``status``
        "cancelled", stopped from outside before it could end (``cancelled``)."""
        if self._close():
            body = {**(summary or {}), "error": error}
            self.reporter._chain(self.uuid, _async(lambda: [rollout_record(
                self.uuid, status=status, end_time=now_iso(), summary_json=json.dumps(body, default=str),
                **self.identity)]))

    def cancelled(self, reason: str) -> None:
        """AReaL cancelled the rollout (the run ended while it was in flight): not a failure of the episode."""
        self.failed(reason, status="cancelled")

    def _close(self) -> bool:
        """True the first time; and only when the reporter sends at all."""
        first = not self.closed
        self.closed = True
        return first and self.reporter.enabled


def turn_view_records(rollout_uuid: str, rollout_id: Any, view: TurnView, *, reward: float | None = None,
                      last: bool = False) -> list[Record]:
    """The turn, its actions and its screenshot observation as monitor records."""
    turn_id = turn_client_id(rollout_uuid, view.turn)
    uri = f"sha256:{view.image_sha256}" if view.image_sha256 else None
    first_action = view.actions[0]["action"] if view.actions else None
    metrics = {**view.metrics, **({"invalid": view.invalid} if view.invalid else {})}
    records = [turn_record(rollout_uuid, view.turn, rollout_id=rollout_id, end_time=now_iso(),
                           turn_time=view.latency_s, thinking=view.thinking, text=view.text, action=first_action,
                           metrics=metrics, screen_before=uri, reward=reward, episode_done=last,
                           image_sha256=view.image_sha256, tokens=view.tokens)]
    records += [action_record(rollout_uuid, view.turn, i, turn_id=turn_id, name=a["name"], args=a["args"],
                              call_id=a["call_id"], action=a["action"]) for i, a in enumerate(view.actions)]
    if uri:
        records.append(observation_record(rollout_uuid, view.turn, "screenshot_before", turn_id=turn_id,
                                          screenshot_uri=uri))
    return records


_SECRET_KEYS = ("token", "password", "secret", "api_key", "apikey")


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("***" if any(s in str(k).lower() for s in _SECRET_KEYS) and v else _mask_secrets(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_secrets(v) for v in value]
    return value


def _async(fn: Callable[[], list[Record]]) -> Callable[[], Awaitable[list[Record]]]:
    async def run() -> list[Record]:
        return fn()
    return run
