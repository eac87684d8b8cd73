"""The agent loop of one run: screenshot -> prompt -> model -> parse -> act, until the run ends.

Why the run ends the way it does:
- terminate/answer action: the agent decided (``ok: true``; the answer goes to the run result);
- ``maxSteps``, ``maxStepTimeSec``, ``maxRunTimeSec``, cancel: a limit ended it (``ok: false``);
- model or gym failures after retries: ``ok: false`` with the error as reason; a time limit that runs out
  while the model server has not answered is the model server's failure (``failure: model``), not the policy's;
- the model refused a prompt as longer than its context (``context_length_exceeded``): ``ok: false``, the
  policy's (``failure: "policy"``): the episode outgrew what the policy can read, nothing failed;
- an unusable reply (no tool call, bad JSON, unknown action, an action the gym rejects) is an *invalid
  turn*: an ``error`` event, and the reason is shown to the model with the next screenshot. Only
  ``maxInvalidTurns`` invalid turns in a row end the run;
- whose failure it was (``run_end``'s ``failure``): an action the gym answers ``ok: false`` with ``fault: "gym"``
  (it failed to play it: an X error, a page that did not take the input) ends the run as the gym's (``env``),
  never fed back to the model; a step over ``maxStepTimeSec`` is the gym's when more than half of the limit went
  inside gym calls (waits the model asked for not counted), else the policy's (docs/protocols.md 1.5, 2.3).
Every step records its timing split (gym, model, the agent's own overhead) for ``bench/agent_bench.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..genv import GenvClient, GenvError
from ..http.retry import RetryPolicy
from ..mini_agent.states import RunFailure, RunState
from .actions import AgentAction, InvalidAction, ParsedTurn
from .formats import HistoryStep, PromptContext, get_format
from .model_client import MAX_ANSWER_BYTES, ContextExceeded, ModelClient, ModelError, token_record
from .record import ResumePoint, RunRecord, iso
from .schema import RunRequest

logger = logging.getLogger(__name__)

STEP_IMAGE_CALL_ID = "__step_message_image__"


def png_data_url(png: bytes) -> str:
    """Screenshots travel to the model, and are kept for the steps views, as PNG data URLs."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@dataclass
class AgentSettings:
    """Service-wide defaults; a run payload can override ``history_images`` and ``max_invalid_turns``."""

    history_images: int = 3
    max_invalid_turns: int = 3
    max_run_time_s: float = 1800.0        # applies when the payload gives no maxRunTimeSec
    max_concurrent_runs: int = 128
    model_timeout_s: float = 300.0
    model_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=4, backoff_s=0.5))
    gym_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=4, backoff_s=0.5))
    send_token_hints: bool = True
    max_answer_bytes: int = MAX_ANSWER_BYTES   # a longer model answer is not read: a ``model`` failure
    keep_finished_runs: int = 64          # finished runs kept for GETs (~2-3 MB each with screenshots)
    finished_ttl_s: float = 900.0


class RunFailed(Exception):
    """Ends the run with ``ok: false`` and this reason. ``kind`` says whose failure it was, and goes out in
    ``run_end`` as ``failure``: ``env`` (the gym failed a read or an action after retries), ``model`` (the
    model server failed after retries), ``policy`` (the model's own doing: invalid replies, step time).
    A trainer must never score an ``env`` or ``model`` failure as the policy's."""

    def __init__(self, message: str, kind: RunFailure = RunFailure.POLICY) -> None:
        super().__init__(message)
        self.kind = kind


class GymClock:
    """Seconds one step has spent inside gym calls, the call in progress included: a step's time limit can run
    out inside one, and the time-out is then the gym's if the gym held most of the step."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._since: float | None = None

    @contextlib.contextmanager
    def timing(self, asked_s: float = 0.0):
        """Count the block's time as the gym's, less ``asked_s`` (a wait the model itself asked the gym for)."""
        self._since = time.perf_counter() + asked_s
        try:
            yield
        finally:
            self.spent += max(0.0, time.perf_counter() - self._since)
            self._since = None

    def total(self) -> float:
        running = max(0.0, time.perf_counter() - self._since) if self._since is not None else 0.0
        return self.spent + running


def _asked_wait_s(action: dict[str, Any]) -> float:
    """Seconds of waiting an action itself asks the gym for (``wait``, a long press): the policy's time."""
    if action.get("type") not in ("wait", "press", "long_press"):
        return 0.0
    ms = action.get("ms", action.get("duration_ms"))
    return ms / 1000 if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0 else 0.0


def _retryable_act_error(exc: GenvError) -> bool:
    """An action may be resent only if the gym surely did not run it: no connection was made, or the
    gym said it is busy. A timeout or a 5xx may have clicked already, and clicking twice is not a retry."""
    return isinstance(exc.__cause__, (httpx.ConnectError, httpx.ConnectTimeout)) or exc.status_code in (429, 503)


class AgentRun:
    """Drives one run. It owns its record and history; the HTTP clients (model, gym) are shared by all
    runs of the service, so a run costs no connection or TLS set-up of its own."""

    def __init__(self, record: RunRecord, request: RunRequest, settings: AgentSettings,
                 http: httpx.AsyncClient, gym: GenvClient, hints_supported: dict[str, bool],
                 start: ResumePoint | None = None) -> None:
        self.record = record
        self.gym = gym
        self.req = request
        self.settings = settings
        self.format = get_format(request.agent)
        sampling = dict(self.format.default_sampling)
        if request.sampling is not None:
            sampling.update(request.sampling.to_body())
        self.sampling = sampling
        api_key = request.model.api_key.get_secret_value() if request.model.api_key else None
        self.model = ModelClient(http, request.model.base_url, api_key, retry=settings.model_retry,
                                 timeout_s=settings.model_timeout_s, hints_supported=hints_supported,
                                 send_token_hints=settings.send_token_hints,
                                 max_answer_bytes=settings.max_answer_bytes)
        self.ctx = PromptContext(instruction=request.task, space=request.standard_action_space,
                                 history_images=request.history_images or settings.history_images)
        self.max_invalid = request.max_invalid_turns or settings.max_invalid_turns
        self.history: list[HistoryStep] = []
        # a continuation (``startFrom``) begins where another run stood after ``start.steps`` steps
        self.start = start or ResumePoint(steps=0, history=(), pointer=None, feedback=None, invalid_in_a_row=0)
        self.history.extend(self.start.history)
        self.ctx.pointer = self.start.pointer
        self.end_reason = ""
        self.clock = GymClock()   # the current step's time inside gym calls
        self.began = 0.0          # when the run began (time.monotonic)

    # -- entry -------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run to the end; never raises (the outcome is in the record and its ``run_end`` event)."""
        rec = self.record
        limit = self.req.max_run_time_s or self.settings.max_run_time_s
        # a continuation has the time its path has left (ResumePoint.elapsed_s: its parent's, equal for siblings)
        deadline = asyncio.timeout(max(limit - self.start.elapsed_s, 0.0))
        self.began = time.monotonic()
        try:
            async with deadline:
                await self._loop(self.gym)
        except asyncio.CancelledError:
            rec.finish(False, "cancelled" if rec.cancel_requested else "agent service shutting down",
                       status=RunState.CANCELLED)
        except TimeoutError:
            if not deadline.expired():
                raise
            if self.model.cut_off:   # the model server never answered in time: not the policy's doing
                reason = f"maxRunTimeSec exceeded ({limit:g} s) waiting for the model server's answer"
                rec.emit("error", message=reason)
                rec.finish(False, reason, failure=RunFailure.MODEL)
            else:
                rec.emit("error", message=f"run exceeded maxRunTimeSec ({limit:g} s)")
                rec.finish(False, f"maxRunTimeSec exceeded ({limit:g} s)")
        except RunFailed as exc:
            rec.emit("error", message=str(exc))
            rec.finish(False, str(exc), failure=exc.kind)
        except Exception as exc:  # a bug must end this run, not the service
            logger.exception("run %s crashed", rec.run_id)
            rec.emit("error", message=f"internal error: {type(exc).__name__}: {exc}")
            rec.finish(False, f"internal error: {type(exc).__name__}: {exc}")
        logger.info("run %s ended: ok=%s reason=%s steps=%d", rec.run_id, rec.ok, rec.reason, len(rec.steps))

    async def _loop(self, gym: GenvClient) -> None:
        rec, req = self.record, self.req
        info = await self._gym_read(gym.get_execution(req.env.execution_id), "get execution")
        screen = info.get("screen") if isinstance(info, dict) else None
        if isinstance(screen, dict):
            self.ctx.screen = (int(screen.get("width") or 0), int(screen.get("height") or 0))
        model_name = req.model.name or await self._model_call(self.model.model_name())
        feedback, consecutive_invalid = self.start.feedback, self.start.invalid_in_a_row
        for step in range(self.start.steps + 1, req.max_steps + 1):
            self.clock = GymClock()
            rec.running_step = (step, time.monotonic())   # what a continuation started meanwhile shares
            if req.max_step_time_s:
                # the first step of a continuation started while its parent's ran has what that one has left
                used = self.start.next_step_s if step == self.start.steps + 1 else 0.0
                step_limit = asyncio.timeout(max(req.max_step_time_s - used, 0.0))
                try:
                    async with step_limit:
                        outcome = await self._step(gym, step, model_name, feedback)
                except TimeoutError:
                    if not step_limit.expired():
                        raise
                    raise self._step_timeout(step, req.max_step_time_s) from None
            else:
                outcome = await self._step(gym, step, model_name, feedback)
            rec.running_step = None
            done, feedback = outcome
            if done:  # finished here, after the step's step_end, so run_end is the last event
                rec.finish(True, self.end_reason)
                return
            consecutive_invalid = consecutive_invalid + 1 if feedback else 0
            rec.resume_points.append(ResumePoint(step, tuple(self.history), self.ctx.pointer, feedback,
                                                 consecutive_invalid, self.elapsed_s()))
            if consecutive_invalid >= self.max_invalid:
                raise RunFailed(f"{consecutive_invalid} invalid model replies in a row "
                                f"(last: {rec.steps[-1].get('invalid')})")
        await self._final_screenshot(gym)
        rec.finish(False, f"maxSteps ({req.max_steps}) reached without terminate or answer")

    def elapsed_s(self) -> float:
        """The seconds of ``maxRunTimeSec`` this run's path has used: its parent's before it, then its own."""
        return self.start.elapsed_s + time.monotonic() - self.began

    def _step_timeout(self, step: int, limit: float) -> RunFailed:
        """A step over its limit: the model server's failure when it was still to answer; else the gym's when the
        gym held more than half of the step (it would have ended in time with a gym answering in its usual
        milliseconds); else the policy's (its model's time)."""
        if self.model.cut_off:
            return RunFailed(f"step {step} exceeded maxStepTimeSec ({limit:g} s) waiting for the model server's "
                             f"answer", RunFailure.MODEL)
        in_gym = self.clock.total()
        why = f"step {step} exceeded maxStepTimeSec ({limit:g} s; {in_gym:.1f} s of it inside the gym)"
        return RunFailed(why, RunFailure.ENV if in_gym > limit / 2 else RunFailure.POLICY)

    # -- one step ----------------------------------------------------------------------------------

    async def _step(self, gym: GenvClient, step: int, model_name: str,
                    feedback: str | None) -> tuple[bool, str | None]:
        """Returns (run done, feedback for the next step or None)."""
        rec = self.record
        eid = self.req.env.execution_id
        t_start = time.perf_counter()
        gym_s = model_s = 0.0
        rec.emit("step_start", step)
        step_obj: dict[str, Any] = {"step": step, "index": step - 1, "startTs": rec.events[-1]["ts"],
                                    "messages": [], "actions": [], "thinking": None, "text": None}
        rec.steps.append(step_obj)
        try:
            t0 = time.perf_counter()
            with self.clock.timing():
                png = await self._gym_read(gym.screenshot(eid), "screenshot")
            gym_s += time.perf_counter() - t0
            shot = png_data_url(png)
            rec.screenshots[str(step)] = shot
            self._link_after(step)
            messages = self.format.build_messages(self.ctx, self.history, shot, feedback)
            body = {"model": model_name, "messages": messages, **self.sampling}
            t0 = time.perf_counter()
            response = await self._model_call(self.model.complete(
                body, lambda sent: rec.emit("model_call", step, modelSpecificInput=sent)))
            model_s += time.perf_counter() - t0
            rec.emit("model_output", step, modelOutput=response)
            rec.tokens.append(token_record(step, response))
            message = response["choices"][0]["message"]
            reply = message.get("content") if isinstance(message.get("content"), str) else ""
            step_obj["messages"] = [self._step_user_message(step, feedback),
                                    {"role": "assistant", "content": reply}]
            try:
                turn = self.format.parse(message, self.ctx)
            except InvalidAction as exc:
                return False, self._invalid(step, step_obj, shot, feedback, reply, str(exc))
            step_obj["thinking"], step_obj["text"] = turn.thinking, turn.text
            for index, action in enumerate(turn.actions):
                error, spent = await self._execute(gym, step, index, action, step_obj)
                gym_s += spent
                if error:
                    return False, self._invalid(step, step_obj, shot, feedback, reply, error, turn)
                if action.terminal:
                    self._remember(step, shot, feedback, reply, turn)
                    if action.answer is not None:
                        rec.answer = action.answer
                    gym_s += await self._final_screenshot(gym)
                    self.end_reason = f"agent called {action.name} ({action.status})"
                    return True, None
            self._remember(step, shot, feedback, reply, turn)
            return False, None
        finally:
            total = time.perf_counter() - t_start
            step_obj["timing"] = {"stepMs": round(total * 1000, 3), "gymMs": round(gym_s * 1000, 3),
                                  "modelMs": round(model_s * 1000, 3),
                                  "overheadMs": round((total - gym_s - model_s) * 1000, 3)}
            rec.emit("step_end", step)
            step_obj["endTs"] = rec.events[-1]["ts"]

    async def _execute(self, gym: GenvClient, step: int, index: int, action: AgentAction,
                       step_obj: dict[str, Any]) -> tuple[str | None, float]:
        """Run one action; returns (error text for the model if the gym refused it, seconds in the gym)."""
        rec = self.record
        started = rec.now()
        t0 = time.perf_counter()
        result: dict[str, Any] | None = None
        error: str | None = None
        gym_s = 0.0
        gym_failed: str | None = None
        if action.gym_action is not None:
            try:
                with self.clock.timing(_asked_wait_s(action.gym_action)):
                    result = await self._gym_act(gym, action.gym_action)
            except GenvError as exc:  # 4xx: the gym rejected the action and changed nothing
                error = f"the environment rejected {action.name}: {exc.detail}"
            if result is not None and result.get("ok") is False:
                if result.get("fault") == "gym":   # the gym failed to play it: not the policy's to learn from
                    gym_failed = f"the gym failed to perform {action.name}: {result.get('error')}"
                else:   # the policy's, or a gym that does not say (docs/protocols.md 1.5)
                    error = f"the environment could not perform {action.name}: {result.get('error')}"
            gym_s = time.perf_counter() - t0
            if result is not None and action.pointer is not None:
                self.ctx.pointer = action.pointer
        duration = (time.perf_counter() - t0) * 1000
        entry = {"name": action.name, "args": action.args, "callId": action.call_id,
                 "gymAction": action.gym_action, "rawResult": result,
                 "obs": {"screenshots": [{"name": "screenshot_before", "url": self._shot_path(str(step))}]}}
        if error:
            entry["rawFeedback"] = error
        if action.answer is not None:
            entry["args"] = {**action.args, "content": action.answer}
        step_obj["actions"].append(entry)
        rec.emit("action_executed", step, actionIndex=index, action={k: v for k, v in entry.items() if k != "obs"},
                 startTs=iso(started), endTs=iso(rec.now()), durationMs=round(duration, 3))
        if gym_failed:
            raise RunFailed(gym_failed, RunFailure.ENV)
        return error, gym_s

    # -- helpers -----------------------------------------------------------------------------------

    def _invalid(self, step: int, step_obj: dict[str, Any], shot: str, feedback: str | None, reply: str,
                 reason: str, turn: ParsedTurn | None = None) -> str:
        rec = self.record
        rec.invalid_turns += 1
        step_obj["invalid"] = reason
        rec.emit("error", step, message=f"invalid model output: {reason}", invalid=True)
        summary = f"(invalid: {reason})" if turn is None else f"{self.format.summarize(turn)} (failed: {reason})"
        self.history.append(HistoryStep(step=step, screenshot=shot, feedback=feedback, reply=reply, summary=summary))
        return self.format.feedback_text(reason)

    def _remember(self, step: int, shot: str, feedback: str | None, reply: str, turn: ParsedTurn) -> None:
        self.history.append(HistoryStep(step=step, screenshot=shot, feedback=feedback, reply=reply,
                                        summary=self.format.summarize(turn)))

    def _shot_path(self, name: str) -> str:
        return f"/runs/{self.record.run_id}/screenshots/{name}"

    def _step_user_message(self, step: int, feedback: str | None) -> dict[str, Any]:
        parts: list[dict[str, Any]] = [{"type": "text", "text": feedback}] if feedback else []
        parts.append({"type": "image_url", "image_url": {"url": self._shot_path(str(step))},
                      "callId": STEP_IMAGE_CALL_ID})
        return {"role": "user", "content": parts}

    def _link_after(self, step: int) -> None:
        """The screenshot of step n is the 'after' of step n-1's actions (and 'final' of the last one)."""
        name = str(step)
        previous = self.record.steps[-2] if step > 1 and len(self.record.steps) >= 2 else None
        if previous:
            for entry in previous["actions"]:
                entry["obs"]["screenshots"].append({"name": "screenshot_after", "url": self._shot_path(name)})

    async def _final_screenshot(self, gym: GenvClient) -> float:
        """Best effort: the screen after the last action, for viewers (never fatal). Returns seconds spent."""
        t0 = time.perf_counter()
        try:
            with self.clock.timing():
                png = await gym.screenshot(self.req.env.execution_id)
        except GenvError as exc:
            logger.info("run %s: no final screenshot: %s", self.record.run_id, exc)
            return time.perf_counter() - t0
        spent = time.perf_counter() - t0
        self.record.screenshots["final"] = png_data_url(png)
        if self.record.steps:
            for entry in self.record.steps[-1]["actions"]:
                entry["obs"]["screenshots"].append({"name": "screenshot_after", "url": self._shot_path("final")})
        return spent

    async def _gym_read(self, call, what: str) -> Any:
        """Reads are retried inside GenvClient (transport errors, 5xx); what fails here is final."""
        try:
            return await call
        except GenvError as exc:
            raise RunFailed(f"gym {what} failed: {exc}", RunFailure.ENV) from exc

    async def _gym_act(self, gym: GenvClient, action: dict[str, Any]) -> dict[str, Any]:
        policy = self.settings.gym_retry
        for attempt in range(1, policy.attempts + 1):
            try:
                return await gym.act(self.req.env.execution_id, action)
            except GenvError as exc:
                if exc.status_code is not None and 400 <= exc.status_code < 500 and exc.status_code != 429:
                    raise  # rejected action: the caller turns it into feedback for the model
                if not _retryable_act_error(exc):
                    raise RunFailed(f"gym action failed: {exc}", RunFailure.ENV) from exc
                if attempt == policy.attempts:
                    raise RunFailed(f"gym action failed after {attempt} tries: {exc}", RunFailure.ENV) from exc
                logger.warning("run %s: gym act failed (%s); retry %d", self.record.run_id, exc, attempt)
                await asyncio.sleep(policy.delay(attempt))
        raise AssertionError("unreachable")

    async def _model_call(self, call) -> Any:
        try:
            return await call
        except ContextExceeded as exc:   # the prompt outgrew the policy's context: its episode ends here
            raise RunFailed(str(exc), RunFailure.POLICY) from exc
        except ModelError as exc:
            raise RunFailed(str(exc), RunFailure.MODEL) from exc

