"""One computer-use episode, the core of the product: ``play_episode``.

Create an execution of a task on the gym -> open a policy-endpoint episode (its own bearer key) -> start the
agent run with ``model.baseUrl`` = the endpoint and ``apiKey`` = the key -> wait -> evaluate (the reward) ->
terminate (always, in ``finally``). The endpoint recorded every model turn exactly as the engine saw it.

Outcomes: an episode is either evaluated (``EpisodeOutcome``) or dropped (``Dropped``, with its cause: the
gym, the agent service or the model server failed, or the episode crashed; the gym's failure also when the agent
did not report it but the gym's evaluation says the execution ended on a fault of its own: ``gym_fault_decided``;
one the agent recovered from is counted, not dropped), never given a reward it did not earn. A run
that merely ends badly (timeout, the agent gave up, unparseable output, a prompt that outgrew the policy's context)
is still evaluated and keeps its real, possibly zero, reward.

Used by the workflow (``CUAAgentWorkflow``: a GRPO group of these), by the held-out evaluation
(``cua_rl.evaluate``) and by tests; ``EpisodeSetup`` is what every episode of one workflow shares.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from cua_rl.genv import GenvClient, GenvError
from cua_rl.mini_agent import GenvEnv, MiniAgentClient, MiniAgentError, ModelEndpoint, RunRequest, Sampling, StartFrom
from cua_rl.mini_agent.states import RunFailure
from cua_rl.monitor import RolloutReport
from cua_rl.policy import EndpointSettings, PolicyEndpoint
from cua_rl.policy.endpoint import endpoint_hosts
from cua_rl.runs import DropCause
from cua_rl.trajectory import EpisodeOutcome
from cua_rl.trajectory.config import TrajectoryConfig
from cua_rl.trajectory.shaping import shaped_reward

from .sections import AgentTarget, EpisodeLimits, GymTarget, ModelTarget

logger = logging.getLogger(__name__)

@dataclass
class Dropped:
    """An episode that was not evaluated: ``cause`` (``cua_rl.runs.DropCause``; its value is taken too), what
    happened and, where known, how many policy turns it had played (what the health check of drops by episode
    length reads)."""

    cause: DropCause
    reason: str
    turns: int | None = None

    def __post_init__(self) -> None:
        try:
            self.cause = DropCause(self.cause)
        except ValueError:
            raise ValueError(f"unknown cause {self.cause!r}; one of {[c.value for c in DropCause]}") from None


@dataclass
class EpisodeSetup:
    """What every episode of one workflow shares: where it plays (gym, agent service, the model the agent
    calls), its limits, the endpoint's settings (for the address the agent is told), the reward's shaping
    (``trajectory``), the sampling the agent is told (informational: the endpoint samples with the trainer's
    gconfig whatever the agent sends) and the endpoint URLs already announced in the log (the rollout
    worker's set, shared across groups)."""

    gym: GymTarget
    agent: AgentTarget
    model: ModelTarget
    limits: EpisodeLimits
    settings: EndpointSettings
    trajectory: TrajectoryConfig
    sampling: Sampling
    announced: set[str] = field(default_factory=set)


async def play_episode(setup: EpisodeSetup, endpoint: PolicyEndpoint | None, data: dict, index: int,
                       report: RolloutReport | None = None, seed: int | None = None,
                       placement=None) -> EpisodeOutcome | Dropped:
    """One episode of task row ``data`` (the ``index``-th of its group, on instance ``seed``): create an
    execution on the gym, let the agent play it against ``endpoint`` (None: the agent calls
    ``setup.model.base_url``, another model, and no turn is recorded), evaluate it, terminate it (always).
    An evaluated episode is an ``EpisodeOutcome`` with its (shaped) reward and recorded turns; one the
    infrastructure failed is ``Dropped`` with its cause. ``report``: the monitor's record of this rollout.
    The gym is one host: the row's ``gym_base_url`` (placed by the group when the run has several) or the
    setup's; ``placement`` (cua_rl.genv.fleet.Placement, with a fleet) makes the execution
    (``Placement.execution``), so the fleet hears how each create went."""
    gym_url = data.get("gym_base_url") or setup.gym.base_url
    if "," in gym_url:
        raise ValueError(f"play_episode plays on one gym host, got {gym_url!r}: place the group first "
                         "(cua_rl.workflow.placement.play_group)")
    gym_id = data.get("gym_id") or setup.gym.gym_id
    task_id = str(data["task_id"])
    where = f"task {task_id} episode {index}"
    options = {"seed": seed} if seed is not None else None
    started = time.monotonic()   # an episode's seconds count its create's wait too
    try:
        # a gym at capacity, down or restarting is waited for (the client's back-off), within the episode's
        # time limit: nothing was created, so no data position is spent on a service's gap
        async with GenvClient(gym_url, gym_id) as gym, \
                _execution(gym, placement, task_id, options, setup.limits.max_task_time_seconds) as execution:
            return await play_on(setup, endpoint, data, index, gym, execution, report, seed=seed, started=started)
    except (GenvError, MiniAgentError) as exc:
        return _dropped_by(exc, where, gym_url)


def _execution(gym: GenvClient, placement, task_id: str, options: dict | None, busy_wait_s: float):
    """The episode's execution on ``gym`` (a context that terminates it): made through the placement with a fleet,
    so that the fleet hears how its create went."""
    if placement is None:
        return gym.execution(task_id, options, busy_wait_s=busy_wait_s)
    return placement.execution(gym, task_id, options, busy_wait_s=busy_wait_s)


def _dropped_by(exc: GenvError | MiniAgentError, where: str, gym_url: str) -> Dropped:
    cause = DropCause.GYM if isinstance(exc, GenvError) else DropCause.AGENT_SERVICE
    logger.error("%s: %s failure on %s, episode dropped: %s", where, cause.replace("_", " "), gym_url, exc)
    return Dropped(cause, f"{type(exc).__name__}: {exc}")   # reported by the workflow (its monitor record)


@dataclass
class PathHooks:
    """What a tree group's path (cua_rl/workflow/tree.py) adds to an episode: the agent continues another run's
    episode (``start_from``: a forked execution), ``on_episode`` is told the policy endpoint's episode once it is
    open (before the agent's first call: the tree holds calls on it), ``on_started`` the agent run's id."""

    start_from: StartFrom | None = None
    on_episode: Callable[[Any], None] | None = None
    on_started: Callable[[str], None] | None = None
    info: dict[str, Any] = field(default_factory=dict)   # kept in the outcome's info and the monitor's summary


async def play_on(setup: EpisodeSetup, endpoint: PolicyEndpoint | None, data: dict, index: int, gym: GenvClient,
                  execution, report: RolloutReport | None = None, seed: int | None = None,
                  hooks: PathHooks | None = None, started: float | None = None) -> EpisodeOutcome | Dropped:
    """The agent plays ``execution`` (created or forked by the caller, who terminates it) against ``endpoint``,
    then the gym evaluates it: ``play_episode`` without the create. Raises ``GenvError`` and ``MiniAgentError``
    for the caller to drop the episode. ``started``: when the episode began (``time.monotonic()``; default now),
    what its ``seconds`` count from."""
    gym_url, gym_id = gym.base_url, gym.gym_id
    task_id = str(data["task_id"])
    started = time.monotonic() if started is None else started
    where = f"task {task_id} episode {index}"
    if report is not None:
        live = execution.raw.get("live_view")
        report.execution(execution.execution_id,
                         gym_url + live if isinstance(live, str) and live.startswith("/") else None)
    hooks = hooks or PathHooks()
    played = await _run_agent(setup, endpoint, data, gym_url, gym_id, execution.execution_id,
                              execution.instruction, report, hooks)
    if isinstance(played, Dropped):
        return played
    run, turns = played
    evaluation = await gym.evaluate(execution.execution_id, answer_text=run.answer,
                                    execution_data=run.as_execution_data())
    decided = gym_fault_decided(evaluation, run)
    if decided and setup.trajectory.mutation != "gym_faults_as_policy":
        logger.error("%s: %s; episode dropped", where, decided)
        return Dropped(DropCause.GYM, decided, turns=len(turns) or run.num_steps)   # the agent's steps: no endpoint
    if evaluation.gym_faults:
        logger.info("%s: the gym failed %d call(s) of this execution and the agent went on past them (faults.gym "
                    "%d, none unrecovered): evaluated, the faults counted", where, evaluation.gym_faults,
                    evaluation.gym_faults)
    seconds = time.monotonic() - started
    reward = shaped_reward(float(evaluation.reward), run.steps, setup.trajectory.format_reward,
                           setup.trajectory.action_reward)
    logger.info("%s: reward=%.3f%s run_ok=%s reason=%s turns=%d %.1fs on %s", where, reward,
                f" (task {evaluation.reward:.3f} + shaping)" if reward != evaluation.reward else "", run.ok,
                run.reason, len(turns), seconds, gym_url)
    info = {"success": evaluation.success, "run_ok": run.ok, "reason": run.reason, "seconds": seconds,
            "run_id": run.run_id, "execution_id": execution.execution_id, "seed": seed, "gym_host": gym_url,
            "evaluated_at": time.time(),
            "instruction": execution.instruction, "env_reward": float(evaluation.reward),
            "gym_faults_recovered": evaluation.gym_faults, "gym_counts_faults": evaluation.counts_faults,
            "run_failure": None if run.ok else _failure_kind(run.failure), **hooks.info}
    if report is not None:
        report.finished(reward=reward, task_success=bool(evaluation.success),
                        num_turns=len(turns), num_validators=len(evaluation.validators),
                        evaluation=evaluation.raw,
                        summary={**info, "reward": reward, "task_success": bool(evaluation.success),
                                 "num_turns": len(turns), "task_id": task_id},
                        turns=turns, steps=run.steps, tokenizer=getattr(endpoint, "tokenizer", None),
                        discount=setup.trajectory.turn_discount)
    return EpisodeOutcome(turns=turns, reward=reward, info=info,
                          monitor_uuid=report.uuid if report is not None else None)


def _failure_kind(failure: str | None) -> str:
    """A failed run's kind as the summary counts it: the agent's ``failure`` (docs/protocols.md 2.3), ``unreported``
    when it sends none (a stock gbox-mini-agent), ``other`` for a value the protocol does not name."""
    if failure is None:
        return "unreported"
    return failure if failure in ("env", "model", "policy") else "other"


def gym_fault_decided(evaluation, run) -> str | None:
    """Why the gym's own faults decided this episode (it is dropped as the gym's), or None: none did.

    A fault decided it when the execution ended on it: the gym counts gym faults after the last call it served
    (``faults.gym_unrecovered`` > 0, docs/protocols.md 1.4). One the agent went on past (a screenshot it retried,
    an action answered ``ok: false`` after which the next one played) was recovered from: the episode is the
    policy's, its fault counted. A gym that counts ``faults.gym`` but not the unrecovered ones: a run that ended
    cleanly recovered, any other is dropped (as before, for want of knowing). Our agent ends a run the gym
    failed as ``env`` itself, dropped before the evaluation (``_run_agent``)."""
    if not evaluation.gym_faults:
        return None
    if evaluation.gym_unrecovered is not None:
        if not evaluation.gym_unrecovered:
            return None
        return (f"the execution ended on {evaluation.gym_unrecovered} fault(s) of the gym's own that nothing "
                f"served after (faults.gym_unrecovered; {evaluation.gym_faults} in all)")
    if run.ok:
        return None
    return (f"the gym reported {evaluation.gym_faults} fault(s) of its own in this execution (faults.gym, without "
            f"gym_unrecovered) and the run did not end cleanly ({run.reason})")


async def _run_agent(setup: EpisodeSetup, endpoint, data, gym_url, gym_id, execution_id,
                     instruction: str | None, report: RolloutReport | None, hooks: PathHooks):
    """(run result, recorded turns), or ``Dropped`` when the failure is the infrastructure's. The agent is
    told ``instruction`` (the execution's concrete instance) when there is one, else the row's; each
    recorded turn goes to the monitor as it happens (``report``)."""
    episode = await endpoint.open_episode(setup.agent.base_url) if endpoint else None
    if episode is not None and hooks.on_episode is not None:
        hooks.on_episode(episode)
    if episode is not None and episode.base_url not in setup.announced:   # what a multi-host run must know
        setup.announced.add(episode.base_url)
        logger.info("policy endpoint on %s; the agent service at %s is told to call %s",
                    endpoint_hosts(setup.settings, setup.agent.base_url)[0], setup.agent.base_url,
                    episode.base_url)
    if episode is not None and report is not None:
        tokenizer = getattr(endpoint, "tokenizer", None)
        episode.on_turn = lambda number, turn: report.turn(number, turn, tokenizer)
    model = (ModelEndpoint(base_url=episode.base_url, name=episode.model, api_key=episode.key) if episode
             else ModelEndpoint(base_url=setup.model.base_url, name=setup.model.name or "default"))
    limits = setup.limits
    request = RunRequest(
        task=instruction or str(data.get("instruction") or data.get("description")), model=model,
        env=GenvEnv(gym_base_url=gym_url, gym_id=gym_id, execution_id=execution_id), agent=setup.agent.agent,
        max_steps=limits.max_turns, max_run_time_s=limits.max_task_time_seconds,
        max_step_time_s=limits.max_turn_time_seconds, standard_action_space=setup.agent.action_space,
        # Informational: the endpoint samples with the trainer's gconfig whatever the agent sends.
        sampling=setup.sampling, extra=dict(setup.agent.extra), start_from=hooks.start_from)
    try:
        async with MiniAgentClient(setup.agent.base_url) as agent:
            # an agent service that is down or restarting is waited for (nothing was started)
            run = await agent.run(request, timeout_s=limits.max_task_time_seconds + 60,
                                  poll_interval_s=setup.agent.poll_interval_s,
                                  unreachable_wait_s=limits.max_task_time_seconds, on_started=hooks.on_started)
    finally:
        if episode is not None:
            endpoint.close_episode(episode)
    if episode is not None and episode.overflow and not run.service_failed:
        # the policy's episode ended at the prompt that outgrew its context (policy/endpoint.py OVERFLOW): its
        # own outcome, evaluated whatever the agent reported (a stock agent may call the 400 a model failure)
        logger.info("execution %s: the episode ended at its context overflow (%s); evaluated as the policy's",
                    execution_id, episode.overflow)
    elif (setup.trajectory.mutation == "gym_faults_as_policy" and not run.service_failed
          and run.failure == RunFailure.ENV):
        logger.info("execution %s: the gym failed mid-run (%s); evaluated as the policy's (the learning bench's "
                    "mutation gym_faults_as_policy)", execution_id, run.reason)
    elif run.infrastructure_failed:
        cause = DropCause.AGENT_SERVICE if run.service_failed else {
            RunFailure.ENV: DropCause.GYM, RunFailure.MODEL: DropCause.MODEL_SERVER}[run.failure]
        if cause == DropCause.MODEL_SERVER and episode is not None and not _reached(episode):
            logger.error("execution %s: the agent could not reach the policy endpoint at %s (the URL it was "
                         "given; check that it routes from the agent's host: policy.bind_host / "
                         "advertised_host): %s; episode dropped", execution_id, episode.base_url, run.reason)
            return Dropped(DropCause.POLICY_UNREACHED, f"{episode.base_url} not reached: {run.reason}")
        logger.error("execution %s: the %s failed mid-run (%s); episode dropped", execution_id,
                     cause.replace("_", " "), run.reason)
        return Dropped(cause, run.reason, turns=len(episode.turns) if episode is not None else None)
    if episode is not None and (episode.failed_turns or episode.in_flight or episode.answer_lost):
        # the engine failed a turn, or the run ended on a model call the agent stopped waiting for (its
        # step time limit): the model server failed or was too slow, no decision of the policy's to score
        why = (f"{episode.failed_turns} policy turn(s) failed, {episode.in_flight} never finished in the engine"
               f", the last answer {'never reached the agent' if episode.answer_lost else 'was delivered'}")
        logger.error("execution %s: %s; episode dropped", execution_id, why)
        return Dropped(DropCause.MODEL_SERVER, why, turns=len(episode.turns))
    return run, (episode.turns if episode else [])


def _reached(episode) -> bool:
    """Whether any of the agent's model calls of ``episode`` arrived at the policy endpoint."""
    return bool(episode.turns or episode.failed_turns or episode.undelivered_turns or episode.prompt_mismatches
                or episode.in_flight or episode.vision_token_outputs or episode.dropped_straddles or episode.overflow)
