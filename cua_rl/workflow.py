"""``CUAAgentWorkflow``: one GRPO group of computer-use episodes for one task row -> AReaL tensors.

Per episode: create an execution on the gym -> open a policy-endpoint episode (its own bearer key) ->
start the agent run with ``model.baseUrl`` = the endpoint and ``apiKey`` = the key -> wait -> evaluate
(the reward) -> terminate (always, in ``finally``). The endpoint recorded every model turn exactly as
the engine saw it; ``cua_rl.trajectory`` turns the group into rows with group-normalised rewards.

Outcomes: an infrastructure failure (gym or agent service unreachable, evaluation failing, the policy
engine failing a turn) ends that episode with ``None`` and a logged reason. A run that merely ends badly
(timeout, the agent gave up, unparseable output) is still evaluated and keeps its real, possibly zero,
reward. A group keeps only its evaluated episodes; with fewer than ``min_group_size`` of them it is
rejected, so a group never mixes tasks and a failure never shifts another group's boundaries.

Seeds: every episode of a group creates its execution with the same ``options.seed``, so a gym that
generates instances (MiniWoB++) gives the whole group one instance and GRPO compares like with like;
different groups get different seeds. Seeds are derived, never drawn: from the experiment ``seed``, the
task and the row's stream index (``cua_stream_index``: the position the trainer's loader gave it, unique
across the run and every rollout worker, and the same again on resume; AReaL deals rows to its workers
round-robin, so a count kept per process would give groups of one task on different workers the same
instance). Rows without one (a workflow driven outside the trainer) fall back to this process's count of
groups per task and policy version. Eval groups: the task alone, so every evaluation sees the same
instances. A row's own integer ``seed`` wins. Gyms that ignore the seed are unaffected; the instance's
concrete instruction, when the gym returns one, is what the agent is told.

Training Monitor (optional): with ``monitor_base_url`` and a token in the environment (PROJECT_TOKEN or
MONITOR_PROJECT_TOKEN; never a kwarg, kwargs are logged and saved) each episode posts its rollout (running,
then completed with reward or failed) and validation in the background; see ``cua_rl.monitor.reporter``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import stats_tracker

from cua_rl.areal_ext.resume import STREAM_KEY, record_dropped
from cua_rl.genv import GenvClient, GenvError
from cua_rl.mini_agent import GenvEnv, MiniAgentClient, MiniAgentError, ModelEndpoint, RunRequest, Sampling
from cua_rl.monitor import EpisodeReporter, RolloutReport
from cua_rl.policy import EndpointSettings, PolicyEndpoint
from cua_rl.runs import RunPaths
from cua_rl.trajectory import EpisodeOutcome, group_batch, normalise_group, shuffle_rewards
from cua_rl.trajectory.rows import new_rollout_uuid
from cua_rl.trajectory.shaping import shaped_reward

logger = logging.getLogger(__name__)

# The live counts of every policy endpoint built in this process, per kind ("train", "eval"); registered
# when the endpoint is built, summed by _write_endpoint_totals.
_ENDPOINT_TOTALS: collections.defaultdict[str, list[dict[str, int]]] = collections.defaultdict(list)
# Episodes of this process per kind: evaluated, lost (an infrastructure failure or a crash: never a reward)
# and groups rejected for too few evaluated episodes; written beside the endpoint counts for the summary.
_EPISODES: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
# Training groups started in this process per (task, policy version): the ``nth`` of their seeds.
_GROUPS_RUN: collections.Counter[tuple[str, int]] = collections.Counter()


class CUAAgentWorkflow(RolloutWorkflow):
    """All arguments are plain values so AReaL can rebuild the workflow on a rollout worker."""

    def __init__(self, gconfig: GenerationHyperparameters, model_path: str, gym_base_url: str, gym_id: str,
                 agent_base_url: str, agent: str = "qwen3-vl", action_space: str = "pc", max_turns: int = 20,
                 max_task_time_seconds: float = 600, max_turn_time_seconds: float = 120,
                 policy: dict | None = None, group_size: int = 1, min_group_size: int | None = None,
                 export_style: str = "individual", turn_discount: float = 1.0,
                 normalise_in_group: bool = True, scale_by_std: bool = True, equal_episode_weight: bool = True,
                 model_base_url: str = "", model_name: str = "", poll_interval_s: float = 1.0,
                 monitor_base_url: str = "", monitor_project_id: str = "", monitor_training_id: int | None = None,
                 is_eval: bool = False, stats_dir: str = "", seed: int = 1, seed_instances: bool = True,
                 shuffle_rewards: bool = False, format_reward: float = 0.0, action_reward: float = 0.0):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.gconfig = gconfig
        self.model_path = model_path
        self.gym_base_url, self.gym_id = gym_base_url, gym_id
        self.agent_base_url, self.agent, self.action_space = agent_base_url, agent, action_space
        self.max_turns = max_turns
        self.max_task_time_s, self.max_turn_time_s = float(max_task_time_seconds), float(max_turn_time_seconds)
        self.settings = EndpointSettings.from_dict(asdict(policy) if is_dataclass(policy) else policy)
        self.group_size = group_size
        # One evaluated episode has no sibling to compare with: its GRPO advantage would be 0.
        self.min_group_size = min_group_size if min_group_size is not None else min(2, group_size)
        self.export_style, self.turn_discount = export_style, turn_discount
        self.normalise_in_group, self.scale_by_std = normalise_in_group, scale_by_std
        self.equal_episode_weight = equal_episode_weight
        self.shuffle_rewards = shuffle_rewards   # the learning gate's negative control (TrajectoryConfig)
        self.format_reward, self.action_reward = format_reward, action_reward   # opt-in shaping (TrajectoryConfig)
        self.model_base_url, self.model_name = model_base_url, model_name
        self.poll_interval_s = poll_interval_s
        self.monitor_base_url, self.monitor_project_id = monitor_base_url, monitor_project_id
        self.monitor_training_id, self.is_eval = monitor_training_id, is_eval
        self.stats_dir = stats_dir
        self.seed, self.seed_instances = seed, seed_instances
        self._endpoint: PolicyEndpoint | None = None
        self._endpoint_engine = None
        self._reporter: EpisodeReporter | None = None
        self._reporter_loop = None

    # ---- the policy endpoint, built lazily on the rollout worker -------------------------------------
    def _policy(self, engine) -> PolicyEndpoint:
        if self._endpoint is None or self._endpoint_engine is not engine:
            from areal.utils.hf_utils import load_hf_processor_and_tokenizer

            processor, tokenizer = load_hf_processor_and_tokenizer(self.model_path)
            self._endpoint = PolicyEndpoint(engine, processor, tokenizer, self.gconfig, self.settings)
            self._endpoint_engine = engine
            _ENDPOINT_TOTALS[self._kind].append(self._endpoint.totals)
        return self._endpoint

    # ---- the monitor reporter, one per event loop (its HTTP client belongs to the loop) ------------------
    def _monitor(self) -> EpisodeReporter | None:
        if not self.monitor_base_url:
            return None
        loop = asyncio.get_running_loop()
        if self._reporter is None or self._reporter_loop is not loop:
            self._reporter = EpisodeReporter(self.monitor_base_url, self.monitor_project_id,
                                             self.monitor_training_id)
            self._reporter_loop = loop
        return self._reporter if self._reporter.enabled else None

    async def monitor_flush(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for queued monitor sends: tests and short scripts; AReaL's loop lives on."""
        if self._reporter is not None:
            await self._reporter.flush(timeout_s)

    def _report(self, engine, data: dict, task_id: str, index: int) -> RolloutReport | None:
        try:  # the monitor must never cost an episode: any surprise here means "not reported"
            monitor = self._monitor()
            if monitor is None:
                return None
            version = engine.get_version() if hasattr(engine, "get_version") else None
            return monitor.rollout(
                new_rollout_uuid(), task_id=task_id, task_name=str(data.get("name") or task_id),
                task_description=str(data.get("description") or data.get("instruction") or ""), step=version,
                source_type="step", is_eval=self.is_eval, group_num=data.get("item_idx"), env_index=index,
                group_id=f"{task_id}:{data.get('item_idx', 0)}:{version}", max_turns=self.max_turns,
                model_path=self.model_path)
        except Exception as exc:  # noqa: BLE001
            logger.warning("monitor: rollout of task %s not reported: %s: %s", task_id, type(exc).__name__, exc)
            return None

    # ---- AReaL entry point ------------------------------------------------------------------------
    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any] | None:
        task_id, instruction = data.get("task_id"), data.get("instruction") or data.get("description")
        if not task_id or not instruction:
            logger.error("task row without task_id/instruction rejected: keys=%s", sorted(data))
            return None
        endpoint = None if self.model_base_url else self._policy(engine)
        seed = self._group_seed(engine, data)
        results = await asyncio.gather(*(self._reported_episode(engine, endpoint, data, i, seed)
                                         for i in range(self.group_size)),
                                       return_exceptions=True)
        outcomes: list[EpisodeOutcome] = []
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                logger.error("task %s episode %d crashed: %s: %s", task_id, i, type(res).__name__, res,
                             exc_info=res)
            elif res is not None:
                outcomes.append(res)
        scope = stats_tracker.get(workflow_context.stat_scope())
        rejected = endpoint is not None and len(outcomes) < self.min_group_size
        counts = _EPISODES[self._kind]
        counts["episodes_evaluated"] += len(outcomes)
        counts["episodes_lost"] += len(results) - len(outcomes)
        counts["groups_rejected"] += rejected
        self._write_endpoint_totals()
        for o in outcomes:
            scope.scalar(reward=o.reward, task_success=float(bool(o.info.get("success"))),
                         num_turns=len(o.turns), episode_seconds=o.info["seconds"])
        if endpoint is None:
            return None  # the agent used another model: nothing of this run is trainable
        if rejected:
            logger.warning("task %s: %d of %d episodes evaluated (< %d); group rejected", task_id,
                           len(outcomes), self.group_size, self.min_group_size)
            self._dropped(data)
            return None
        if self.shuffle_rewards:
            outcomes = shuffle_rewards(outcomes, f"{self.seed}:{task_id}:{seed}:{data.get('item_idx')}")
        self._report_advantages(outcomes)
        batch = group_batch(outcomes, normalise=self.normalise_in_group, scale_by_std=self.scale_by_std,
                            style=self.export_style, discount=self.turn_discount,
                            equal_episode_weight=self.equal_episode_weight)
        if batch is None:
            self._dropped(data)
        if batch is not None and STREAM_KEY in data:   # which stream item this group trains (cua_rl/areal_ext/resume.py)
            batch[STREAM_KEY] = torch.full((batch["input_ids"].shape[0],), int(data[STREAM_KEY]),
                                           dtype=torch.long)
        return batch

    def _dropped(self, data: dict[str, Any]) -> None:
        """A training row this workflow returns nothing for: the trainer's loader must count it consumed
        (cua_rl/areal_ext/resume.py, ``record_dropped``), or it would pin the restart point for the rest of the run."""
        if not self.is_eval and self.stats_dir and isinstance(data.get(STREAM_KEY), int):
            record_dropped(self.stats_dir, data[STREAM_KEY])

    @property
    def _kind(self) -> str:
        return "eval" if self.is_eval else "train"

    def _write_endpoint_totals(self) -> None:
        """This worker's running prompt-proof counts as JSON in ``stats_dir`` (the launcher's summary adds
        them up: verified turns, mismatches refused, straddles regenerated, failed turns), with its episode
        counts (evaluated, lost to infrastructure failures, groups rejected). Summed over every
        endpoint this process made: AReaL builds a new workflow instance for every submitted task
        (``RemoteInfEngine._resolve_workflow``), so each group has its own endpoint, and writing only the
        current one's counts reported 17 verified turns for a 20-step run."""
        if not self.stats_dir:
            return
        totals: dict[str, int] = dict(_EPISODES[self._kind])
        for counts in _ENDPOINT_TOTALS[self._kind]:
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
        try:
            name = f"{self._kind}-{socket.gethostname()}-{os.getpid()}.json"
            path = Path(self.stats_dir) / "policy_endpoint" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(totals))
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("could not write the endpoint's counts to %s: %s", self.stats_dir, exc)

    def _report_advantages(self, outcomes: list[EpisodeOutcome]) -> None:
        """Each trained episode's GRPO advantage (the group-normalised reward ``group_batch`` trains on)."""
        reports = [o.info.get("monitor_report") for o in outcomes]
        if not any(reports):
            return
        rewards = [o.reward for o in outcomes]
        values = normalise_group(rewards, self.scale_by_std) if self.normalise_in_group else rewards
        for outcome, report, value in zip(outcomes, reports, values):
            if report is not None:
                report.advantage(value, len(outcome.turns), self.turn_discount)

    def _group_seed(self, engine, data: dict) -> int | None:
        """The one instance seed of this group (see the module docstring); None when seeding is off."""
        if not self.seed_instances:
            return None
        if isinstance(data.get("seed"), int) and not isinstance(data.get("seed"), bool):
            return data["seed"]
        task_id = str(data["task_id"])
        if self.is_eval:
            return instance_seed(self.seed, "eval", task_id, 0, 0)
        if isinstance(data.get(STREAM_KEY), int):
            return instance_seed(self.seed, "stream", task_id, 0, data[STREAM_KEY])
        version = engine.get_version() if hasattr(engine, "get_version") else 0
        nth = _GROUPS_RUN[(task_id, version)]
        _GROUPS_RUN[(task_id, version)] += 1
        return instance_seed(self.seed, "train", task_id, version, nth)

    async def _reported_episode(self, engine, endpoint, data: dict, index: int,
                                seed: int | None = None) -> EpisodeOutcome | None:
        """``_episode`` with its monitor rollout record; a crash or a dropped episode is marked failed."""
        report = self._report(engine, data, str(data["task_id"]), index)
        try:
            outcome = await self._episode(endpoint, data, index, report, seed=seed)
        except BaseException as exc:
            if report is not None:  # cancelled = AReaL dropped the rollout (e.g. the trainer is stopping)
                report.failed("cancelled" if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}")
            raise
        if report is not None and outcome is None:
            report.failed("episode dropped (infrastructure failure, see the rollout worker log)")
        if report is not None and outcome is not None:
            outcome.info["monitor_report"] = report
        return outcome

    async def _episode(self, endpoint: PolicyEndpoint | None, data: dict, index: int,
                       report: RolloutReport | None = None, seed: int | None = None) -> EpisodeOutcome | None:
        gym_url = data.get("gym_base_url") or self.gym_base_url
        gym_id = data.get("gym_id") or self.gym_id
        task_id = str(data["task_id"])
        started = time.monotonic()
        where = f"task {task_id} episode {index}"
        options = {"seed": seed} if seed is not None else None
        try:
            # a gym at capacity, down or restarting is waited for (the client's back-off), within the episode's
            # time limit: nothing was created, so no data position is spent on a service's gap
            async with GenvClient(gym_url, gym_id) as gym, \
                    gym.execution(task_id, options, busy_wait_s=self.max_task_time_s) as execution:
                run, turns = await self._run_agent(endpoint, data, gym_url, gym_id, execution.execution_id,
                                                   execution.instruction, report)
                if run is None:
                    return None
                evaluation = await gym.evaluate(execution.execution_id, answer_text=run.answer,
                                                execution_data=run.as_execution_data())
        except (GenvError, MiniAgentError) as exc:
            logger.error("%s: infrastructure failure, episode dropped: %s", where, exc)
            if report is not None:
                report.failed(f"{type(exc).__name__}: {exc}", {"task_id": task_id})
            return None
        seconds = time.monotonic() - started
        reward = shaped_reward(float(evaluation.reward), run.steps, self.format_reward, self.action_reward)
        logger.info("%s: reward=%.3f%s run_ok=%s reason=%s turns=%d %.1fs", where, reward,
                    f" (task {evaluation.reward:.3f} + shaping)" if reward != evaluation.reward else "", run.ok,
                    run.reason, len(turns), seconds)
        info = {"success": evaluation.success, "run_ok": run.ok, "reason": run.reason, "seconds": seconds,
                "run_id": run.run_id, "execution_id": execution.execution_id, "seed": seed,
                "instruction": execution.instruction, "env_reward": float(evaluation.reward)}
        if report is not None:
            report.finished(reward=reward, task_success=bool(evaluation.success),
                            num_turns=len(turns), num_validators=len(evaluation.validators),
                            evaluation=evaluation.raw,
                            summary={**info, "reward": reward, "task_success": bool(evaluation.success),
                                     "num_turns": len(turns), "task_id": task_id},
                            turns=turns, steps=run.steps, tokenizer=getattr(endpoint, "tokenizer", None),
                            discount=self.turn_discount)
        return EpisodeOutcome(turns=turns, reward=reward, info=info,
                              monitor_uuid=report.uuid if report is not None else None)

    async def _run_agent(self, endpoint, data, gym_url, gym_id, execution_id, instruction: str | None = None,
                         report: RolloutReport | None = None):
        """(run result, recorded turns), or (None, []) when the failure is the infrastructure's. The agent is
        told ``instruction`` (the execution's concrete instance) when there is one, else the row's; each
        recorded turn goes to the monitor as it happens (``report``)."""
        episode = await endpoint.open_episode() if endpoint else None
        if episode is not None and report is not None:
            tokenizer = getattr(endpoint, "tokenizer", None)
            episode.on_turn = lambda number, turn: report.turn(number, turn, tokenizer)
        model = (ModelEndpoint(base_url=episode.base_url, name=episode.model, api_key=episode.key) if episode
                 else ModelEndpoint(base_url=self.model_base_url, name=self.model_name or "default"))
        request = RunRequest(
            task=instruction or str(data.get("instruction") or data.get("description")), model=model,
            env=GenvEnv(gym_base_url=gym_url, gym_id=gym_id, execution_id=execution_id), agent=self.agent,
            max_steps=self.max_turns, max_run_time_s=self.max_task_time_s, max_step_time_s=self.max_turn_time_s,
            standard_action_space=self.action_space,
            # Informational: the endpoint samples with the trainer's gconfig whatever the agent sends.
            sampling=Sampling(temperature=self.gconfig.temperature, top_p=self.gconfig.top_p,
                              max_tokens=self.gconfig.max_new_tokens))
        try:
            async with MiniAgentClient(self.agent_base_url) as agent:
                # an agent service that is down or restarting is waited for (nothing was started)
                run = await agent.run(request, timeout_s=self.max_task_time_s + 60, poll_interval_s=self.poll_interval_s,
                                      unreachable_wait_s=self.max_task_time_s)
        finally:
            if episode is not None:
                endpoint.close_episode(episode)
        if run.infrastructure_failed:
            who = "agent service" if run.service_failed else {"env": "gym", "model": "model server"}[run.failure]
            logger.error("execution %s: the %s failed mid-run (%s); episode dropped", execution_id, who, run.reason)
            return None, []
        if episode is not None and (episode.failed_turns or episode.in_flight or episode.answer_lost):
            # the run ended on a model call the agent stopped waiting for (its step time limit): the model
            # server was too slow for the agent, which is no decision of the policy's to score
            logger.error("execution %s: %d policy turn(s) failed, %d never finished in the engine and the last "
                         "answer %s; episode dropped", execution_id, episode.failed_turns, episode.in_flight,
                         "never reached the agent" if episode.answer_lost else "was delivered")
            return None, []
        return run, (episode.turns if episode else [])

    # ---- train.py helper ----------------------------------------------------------------------------
    @staticmethod
    def kwargs_from_config(config, gconfig: GenerationHyperparameters, group_size: int, *, is_eval: bool = False,
                           monitor_training_id: int | None = None) -> dict[str, Any]:
        """Serialisable constructor kwargs from a ``CUAConfig`` (train and eval differ in gconfig/group).
        The monitor gets its URL, project and training id here, never its token (read from the environment).
        An optional ``trajectory`` section (export_style, turn_discount, normalise_in_group, scale_by_std,
        min_group_size) is passed through when the config has one."""
        extra = asdict(config.trajectory) if is_dataclass(getattr(config, "trajectory", None)) else {}
        return dict(
            gconfig=gconfig, model_path=config.actor.path, gym_base_url=config.gym_base_url,
            gym_id=config.gym_id, agent_base_url=config.gbox_mini_agent_base_url,
            agent=config.gbox_mini_agent_agent, action_space=config.gbox_mini_agent_standard_action_space,
            max_turns=config.max_turns, max_task_time_seconds=config.max_task_time_seconds,
            max_turn_time_seconds=config.max_turn_time_seconds, policy=asdict(config.policy),
            group_size=group_size, model_base_url=config.model_base_url, model_name=config.model_name,
            monitor_base_url=config.monitor_base_url, monitor_project_id=config.project_id,
            monitor_training_id=monitor_training_id, is_eval=is_eval, stats_dir=_stats_dir(config),
            seed=int(config.seed), seed_instances=bool(getattr(config, "gym_seed_instances", True)), **extra)


def _stats_dir(config) -> str:
    """The run's log directory, where the launcher's summary reads the endpoint counts, computed without
    creating it (AReaL's ``StatsLogger.get_log_path`` makes the directory: for ``CUAConfig()`` in a test that
    was ``???/logs/<user>/???/???`` in the working directory). None for a config that names no run."""
    from omegaconf import MISSING

    s = getattr(config, "stats_logger", None)
    if s is None or any(not part or part == MISSING for part in (s.fileroot, s.experiment_name, s.trial_name)):
        return ""
    return str(RunPaths.of(config).logs)


def instance_seed(base: int, phase: str, task_id: str, version: int, nth: int) -> int:
    """A reproducible 31-bit seed for one group (31 bits: safe for any gym's integer type)."""
    digest = hashlib.sha256(f"{base}:{phase}:{task_id}:{version}:{nth}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def has_reward_variance(batch: dict[str, Any]) -> bool:
    """Optional ``dynamic_filter_fn`` ("cua_rl.workflow.has_reward_variance"): drop groups whose episodes all
    scored the same (their normalised rewards are all 0, so they carry no GRPO signal)."""
    return bool(batch["rewards"].abs().sum() > 0)
