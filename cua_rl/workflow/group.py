"""``CUAAgentWorkflow``: one GRPO group of computer-use episodes for one task row -> AReaL tensors.

Each episode is ``cua_rl.workflow.episode.play_episode`` (create an execution, let the agent play it against
the policy endpoint, evaluate, terminate); ``cua_rl.trajectory`` turns the group into rows with
group-normalised rewards.

Outcomes: an episode is either evaluated (``EpisodeOutcome``) or dropped (``Dropped``, with its cause), never
given a reward it did not earn. A group keeps only its evaluated episodes; with fewer than
``trajectory.min_group_size`` of them it is rejected, so a group never mixes tasks and a failure never
shifts another group's boundaries. AReaL gets ``None`` for a rejected group.

Built from typed sections (``cua_rl.workflow.sections``, the policy endpoint's ``EndpointSettings`` and
``TrajectoryConfig``): plain values AReaL can ship to each rollout worker. AReaL builds one of these per
submitted task; what outlives a group (the policy endpoint, the counts, the seeds' counter) is the rollout
worker's (``cua_rl.workflow.worker``). Instance seeds: ``cua_rl.workflow.seeding``; counts on disk for the
run's summary: ``cua_rl.runs``.

Training Monitor (optional): with ``monitor.base_url`` and a token in the environment (PROJECT_TOKEN or
MONITOR_PROJECT_TOKEN; never a kwarg, kwargs are logged and saved) each episode posts its rollout (running,
then completed with reward or failed) and validation in the background; see ``cua_rl.monitor.reporter``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, is_dataclass
from typing import Any

import torch
from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import stats_tracker

from cua_rl.config import TreeConfig
from cua_rl.logs import worker_logging
from cua_rl.mini_agent import Sampling
from cua_rl.monitor import EpisodeReporter, RolloutReport
from cua_rl.policy import EndpointSettings, PolicyEndpoint
from cua_rl.runs import (
    EPISODE_REWARD,
    EPISODE_SHARE,
    EPISODE_SUCCESS,
    STREAM_KEY,
    DropCause,
    record_dropped,
    write_counts,
)
from cua_rl.trajectory import EpisodeOutcome, ScreenshotSwap, episode_values, group_rows, rows_of, shuffle_rewards
from cua_rl.trajectory.config import TrajectoryConfig
from cua_rl.trajectory.mutations import mutate
from cua_rl.trajectory.rows import new_rollout_uuid
from cua_rl.trajectory.tree import leaves, shuffle_leaf_rewards, tree_rows, tree_values, walk

from . import seeding
from .episode import Dropped, EpisodeSetup, play_episode
from .placement import Drained, fleet_for, play_group
from .sections import AgentTarget, EpisodeLimits, GymTarget, ModelTarget, MonitorTarget
from .tree import TreePlayer, check_agent, segments as tree_segments
from .worker import worker_state

logger = logging.getLogger(__name__)

def _section(cls, value, absent=None):
    """A section given as itself or as a dict of all its fields; ``absent()`` where it is None and may be (the
    config's own sections: their defaults are the settings' defaults; the monitor: off)."""
    if value is None:
        if absent is None:
            raise TypeError(f"the {cls.__name__} section is required (cua_rl.workflow.sections.workflow_kwargs "
                            f"builds every section from a CUAConfig)")
        return absent()
    return value if isinstance(value, cls) else cls(**(asdict(value) if is_dataclass(value) else value))


_SWAPS: dict[int, ScreenshotSwap] = {}


def _screenshot_swap(seed: int) -> ScreenshotSwap:
    """The process's one ``ScreenshotSwap`` (its pool spans every group this rollout worker trains)."""
    return _SWAPS.setdefault(seed, ScreenshotSwap(seed))


class CUAAgentWorkflow(RolloutWorkflow):
    """One GRPO group per task row. Every argument is a plain value or a dataclass of them, so AReaL can
    rebuild the workflow on a rollout worker (``cua_rl.workflow.sections.workflow_kwargs`` builds them from a ``CUAConfig``)."""

    def __init__(self, gconfig: GenerationHyperparameters, model: ModelTarget | dict, gym: GymTarget | dict,
                 agent: AgentTarget | dict, limits: EpisodeLimits | dict,
                 policy: EndpointSettings | dict | None = None, trajectory: TrajectoryConfig | dict | None = None,
                 monitor: MonitorTarget | dict | None = None, group_size: int = 1, is_eval: bool = False,
                 stats_dir: str = "", seed: int = 1, tree: TreeConfig | dict | None = None):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        worker_logging()   # on AReaL's rollout worker: our lines go to rollout.log
        self.gconfig = gconfig
        self.model, self.gym, self.agent = _section(ModelTarget, model), _section(GymTarget, gym), \
            _section(AgentTarget, agent)
        self.limits = _section(EpisodeLimits, limits)
        self.settings = EndpointSettings.from_dict(asdict(policy) if is_dataclass(policy) else policy)
        self.trajectory = _section(TrajectoryConfig, trajectory, TrajectoryConfig)
        self.monitor = _section(MonitorTarget, monitor, MonitorTarget.off)
        self.tree = _section(TreeConfig, tree, TreeConfig)   # tree groups (cua_rl/workflow/tree.py); never for eval
        self.group_size, self.is_eval, self.stats_dir, self.seed = group_size, is_eval, stats_dir, seed
        # One evaluated episode has no sibling to compare with: its GRPO advantage would be 0.
        t = self.trajectory
        self.min_group_size = t.min_group_size if t.min_group_size is not None else min(2, group_size)
        self._worker = worker_state(self._kind)
        self.episode_setup = EpisodeSetup(
            gym=self.gym, agent=self.agent, model=self.model, limits=self.limits, settings=self.settings,
            trajectory=self.trajectory, announced=self._worker.announced,
            sampling=Sampling(temperature=gconfig.temperature, top_p=gconfig.top_p,
                              max_tokens=gconfig.max_new_tokens))
        self._reporter: EpisodeReporter | None = None
        self._reporter_loop = None

    @property
    def _kind(self) -> str:
        return "eval" if self.is_eval else "train"

    # ---- the policy endpoint: the rollout worker's, built by the first group that needs it ------------
    def policy_endpoint(self, engine) -> PolicyEndpoint:
        """The rollout worker's policy endpoint for ``engine`` and this workflow's model and settings."""
        def build() -> PolicyEndpoint:
            from areal.utils.hf_utils import load_hf_processor_and_tokenizer

            processor, tokenizer = load_hf_processor_and_tokenizer(self.model.path)
            return PolicyEndpoint(engine, processor, tokenizer, self.gconfig, self.settings)
        return self._worker.endpoint(engine, (self.model.path, repr(self.gconfig), repr(self.settings)), build)

    # ---- the monitor reporter, one per event loop (its HTTP client belongs to the loop) ------------------
    def _monitor(self) -> EpisodeReporter | None:
        if not self.monitor.base_url:
            return None
        loop = asyncio.get_running_loop()
        if self._reporter is None or self._reporter_loop is not loop:
            self._reporter = EpisodeReporter(self.monitor.base_url, self.monitor.project_id,
                                             self.monitor.training_id)
            self._reporter_loop = loop
        return self._reporter if self._reporter.enabled else None

    async def monitor_flush(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for queued monitor sends: tests and short scripts; AReaL's loop lives on."""
        if self._reporter is not None:
            await self._reporter.flush(timeout_s)

    def group_identity(self, engine, data: dict) -> tuple[int, str]:
        """(group number, group id) of the group about to run for task row ``data``, unique in the run: the
        row's stream index when it has one (training rows; the same again if a resumed run plays it again at
        another version), else this worker's count of its groups, with a token of this process (eval rows, rows
        without an index: several rollout workers count at once). The monitor's group view groups by the id."""
        task_id = str(data.get("task_id"))
        version = engine.get_version() if hasattr(engine, "get_version") else None
        if isinstance(data.get(STREAM_KEY), int):
            number = int(data[STREAM_KEY])
            return number, f"{task_id}:s{number}:{version}"
        number = self._worker.next_group()
        return number, f"{task_id}:{self._worker.token}-{number}:{version}"

    def _report(self, engine, data: dict, task_id: str, index: int,
                group: tuple[int, str] | None = None) -> RolloutReport | None:
        try:  # the monitor must never cost an episode: any surprise here means "not reported"
            monitor = self._monitor()
            if monitor is None:
                return None
            version = engine.get_version() if hasattr(engine, "get_version") else None
            number, group_id = group if group is not None else self.group_identity(engine, data)
            return monitor.rollout(
                new_rollout_uuid(), task_id=task_id, task_name=str(data.get("name") or task_id),
                task_description=str(data.get("description") or data.get("instruction") or ""), step=version,
                source_type="step", is_eval=self.is_eval, group_num=number, env_index=index,
                group_id=group_id, max_turns=self.limits.max_turns, model_path=self.model.path)
        except Exception as exc:  # noqa: BLE001
            logger.warning("monitor: rollout of task %s not reported: %s: %s", task_id, type(exc).__name__, exc)
            return None

    # ---- AReaL entry point ------------------------------------------------------------------------
    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any] | None:
        task_id, instruction = data.get("task_id"), data.get("instruction") or data.get("description")
        if not task_id or not instruction:
            logger.error("task row without task_id/instruction rejected: keys=%s", sorted(data))
            return None
        endpoint = None if self.model.base_url else self.policy_endpoint(engine)
        seeds = self.episode_seeds(engine, data)
        group = self.group_identity(engine, data)
        if self.tree.enabled and not self.is_eval and endpoint is not None:
            return await self._arun_tree(engine, endpoint, data, seeds[0], group)
        # every episode of the group on one gym host (placed when the run has several: cua_rl/workflow/placement.py)
        results, _host = await play_group(
            self.fleet(data), data.get("gym_base_url") or self.gym.base_url, self.group_size,
            lambda url, i, placement: self._reported_episode(engine, endpoint, {**data, "gym_base_url": url}, i,
                                                             seeds[i], group, placement),
            on_drained=self._drained)
        outcomes: list[EpisodeOutcome] = []
        lost: list[DropCause] = []
        lost_turns: list[int | None] = []   # the turns each lost episode played (None: unknown)
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                logger.error("task %s episode %d crashed: %s: %s", task_id, i, type(res).__name__, res,
                             exc_info=res)
                lost.append(DropCause.CRASH)
                lost_turns.append(None)
            elif isinstance(res, Dropped):
                lost.append(res.cause)
                lost_turns.append(res.turns)
            else:
                outcomes.append(res)
        rejected = endpoint is not None and len(outcomes) < self.min_group_size
        self._counted(endpoint, outcomes, lost, rejected, lost_turns=lost_turns)
        if endpoint is None:
            return None  # the agent used another model: nothing of this run is trainable
        if rejected:
            return self._rejected(data, "episodes", len(outcomes), lost)
        t = self.trajectory
        if t.shuffle_rewards:
            outcomes = shuffle_rewards(outcomes, f"{self.seed}:{task_id}:{seeds[0]}:{data.get('item_idx')}")
        if t.shuffle_screenshots:
            outcomes = _screenshot_swap(self.seed)(outcomes)
        values = episode_values(outcomes, **t.value_options())   # what each episode trains with
        if t.drop_zero_variance and not any(values):
            logger.info("task %s: every episode's value is 0 (rewards all %s); group dropped "
                        "(trajectory.drop_zero_variance)", task_id, outcomes[0].reward)
            self._worker.episodes["groups_zero_variance"] += 1
            self._dropped(data)
            return None
        self._report_advantages(outcomes, values)
        # in a thread: packing the rows' images (trajectory/pixels.py) sorts each distinct screenshot, and this
        # loop serves the policy endpoint of every episode in flight
        batch = await asyncio.to_thread(group_rows, outcomes, values, **t.row_options())
        if batch is not None and t.mutation:
            batch = mutate(batch, t.mutation)
        return self._returned(batch, data, group, outcomes, _host,
                              lambda n: episode_columns(outcomes, t.export_style, n))

    def _counted(self, endpoint, outcomes: list[EpisodeOutcome], lost: list[str], rejected: bool, *,
                 lost_turns: list[int | None] = (), **more: int) -> None:
        """A group's evaluated episodes (a tree's leaves) and lost ones in the worker's counts (``more``: other
        counters to add; ``lost_turns``: the turns each lost one played, where known), on disk for the run's
        summary, and in the step's statistics."""
        self._worker.count_group(len(outcomes), lost, rejected)
        self._worker.count_use(outcomes)
        self._worker.episodes.update(more)
        write_counts(self._kind, self.stats_dir, self._worker.totals())
        self._record_stats(endpoint, outcomes, lost, lost_turns)

    def _rejected(self, data: dict, what: str, got: int, lost: list[str]) -> None:
        """A group with fewer evaluated ``what`` than ``trajectory.min_group_size``: nothing to train."""
        logger.warning("task %s: %d of %d %s evaluated (< %d; lost: %s); group rejected", data.get("task_id"), got,
                       self.group_size, what, self.min_group_size, ", ".join(lost) or "none")
        self._dropped(data)
        return None

    def _returned(self, batch, data: dict, group: tuple[int, str], outcomes: list[EpisodeOutcome], host: str,
                  columns) -> dict[str, Any] | None:
        """A group's rows as AReaL gets them: the stream item they train and what the step reports
        (``columns(n_rows)``: ``cua_rl.runs.EPISODE_COLUMNS``); a group without rows is recorded as dropped."""
        if batch is None:
            self._dropped(data)
            return None
        if STREAM_KEY in data:   # which stream item this group trains (cua_rl/trainer/resume.py)
            batch[STREAM_KEY] = torch.full((batch["input_ids"].shape[0],), int(data[STREAM_KEY]), dtype=torch.long)
        batch.update(columns(batch["input_ids"].shape[0]))   # what the step reports (cua_rl/trainer/progress.py)
        # where its episodes played and when the last was evaluated (what a fleet must show)
        last = max(o.info.get("evaluated_at", 0.0) for o in outcomes)
        logger.info("task %s: group %s returned for training: %d episodes on %s, the last evaluated at %s",
                    data.get("task_id"), group[1], len(outcomes), host,
                    time.strftime("%H:%M:%S", time.localtime(last)) + f".{int(last * 1000) % 1000:03d}")
        return batch

    async def _arun_tree(self, engine, endpoint, data: dict, seed: int | None,
                         group: tuple[int, str]) -> dict[str, Any] | None:
        """One tree group (cua_rl/workflow/tree.py): its leaves are the group's episodes in every count and
        health check; its segments are credited against their siblings (cua_rl/trajectory/tree.py)."""
        task_id = str(data["task_id"])
        gym_url = data.get("gym_base_url") or self.gym.base_url
        if not self._worker.tree_agent_checked:
            await check_agent(self.agent.base_url)
            self._worker.tree_agent_checked = True
        player = TreePlayer(self.episode_setup, self.tree, endpoint, {**data, "gym_base_url": gym_url}, gym_url,
                            str(data.get("gym_id") or self.gym.gym_id),
                            lambda i: self._report(engine, data, task_id, i, group), seed)
        play = await player.play(self.group_size)
        roots, kept, lost = tree_segments(play), play.kept(), play.lost()
        rejected = len(roots) < self.min_group_size
        # the forks' replayed actions are what they cost the gym, counted as environment steps, as are the turns
        # of children that were no branch (another first prompt than their parent's held one)
        self._counted(endpoint, kept, lost, rejected, tree_forks=play.forks, tree_forks_failed=play.forks_failed,
                      tree_forks_unmatched=play.forks_unmatched, tree_forks_skipped=play.forks_skipped,
                      env_steps=play.replayed_actions + play.unmatched_turns, env_steps_replayed=play.replayed_actions)
        if rejected:
            return self._rejected(data, "tree roots", len(roots), lost)
        t = self.trajectory
        if t.shuffle_rewards:
            shuffle_leaf_rewards(roots, f"{self.seed}:{task_id}:{seed}:{data.get('item_idx')}")
        values = tree_values(roots, **t.value_options())
        if t.drop_zero_variance and not any(values.values()):
            logger.info("task %s: every segment's value is 0; tree dropped (trajectory.drop_zero_variance)", task_id)
            self._worker.episodes["groups_zero_variance"] += 1
            self._dropped(data)
            return None
        self._report_tree_advantages(kept, roots, values)
        batch = await asyncio.to_thread(tree_rows, roots, values, style=t.export_style, discount=t.turn_discount)
        logger.info("task %s: tree of %d roots, %d forks (%d failed, %d children no branch), %d leaves", task_id,
                    len(roots), play.forks, play.forks_failed, play.forks_unmatched, len(kept))
        return self._returned(batch, data, group, kept, gym_url,
                              lambda n: tree_episode_columns(roots, t.export_style, n))

    def _record_stats(self, endpoint, outcomes: list[EpisodeOutcome], lost: list[str],
                      lost_turns: list[int | None] = ()) -> None:
        """This group in the step's statistics (AReaL averages each key over its records): per evaluated
        episode its reward, success, turns and time, plus the indicators the run's health checks read
        (cua_rl/trainer/health.py): no policy turn, ended at max_turns, turns recorded on vLLM without the
        prompt proof, the share of its turns cut at max_new_tokens; per episode, lost or not; per group of two or more, whether every reward was equal."""
        scope = stats_tracker.get(workflow_context.stat_scope())
        unproved = endpoint is not None and endpoint.backend == "vllm" and not endpoint.proves_prompts
        for o in outcomes:
            turns = path_turns(o)
            scope.scalar(reward=o.reward, task_success=float(bool(o.info.get("success"))),
                         num_turns=turns, episode_seconds=o.info["seconds"],
                         no_policy_turn=float(not o.turns), at_max_turns=float(turns >= self.limits.max_turns),
                         unproved_vllm_turns=float(len(o.turns) if unproved else 0), episode_lost=0.0,
                         rows_per_episode=float(rows_of(o.turns, self.trajectory.export_style)))
            if o.turns:   # outputs the engine cut at max_new_tokens (or aborted), not ended by the model
                scope.scalar(truncated_turns=sum(t.stop_reason in ("length", "abort") for t in o.turns) / len(o.turns))
        for _ in lost:
            scope.scalar(episode_lost=1.0)
        self._record_lost_by_length(scope, [path_turns(o) for o in outcomes], lost_turns)
        if len(outcomes) >= 2:
            scope.scalar(zero_reward_variance=float(len({o.reward for o in outcomes}) == 1))

    def _record_lost_by_length(self, scope, evaluated: list[int], lost: list[int | None]) -> None:
        """The share of episodes lost among the long ones (at least half of ``max_turns`` played) and among the
        short ones (``lost_long``, ``lost_short``: 1 per lost episode, 0 per evaluated one of that length; a lost
        episode's length is what it played before the drop). Drops that grow with length take the long, mostly
        failing episodes out of their groups' baselines (survivorship): health's ``lost_length_skew``."""
        if self.limits.max_turns <= 1:
            return
        for turns, was_lost in [(n, 0.0) for n in evaluated] + [(n, 1.0) for n in lost if n is not None]:
            if 2 * turns >= self.limits.max_turns:
                scope.scalar(lost_long=was_lost)
            else:
                scope.scalar(lost_short=was_lost)

    def fleet(self, data: dict[str, Any]):
        """The fleet of gym hosts this row's group is placed on, or None for a single gym."""
        g = self.gym
        return fleet_for(str(data.get("gym_base_url") or ""), g.base_url, str(data.get("gym_id") or g.gym_id),
                         interval_s=g.health_interval_s, timeout_s=g.health_timeout_s)

    def _drained(self, drained: Drained) -> None:
        """A placement of this group lost to its host's drain: counted apart from lost episodes (never in the
        lost-episode health check), and written for the run's summary."""
        self._worker.count_drained(drained.url, drained.episodes)
        write_counts(self._kind, self.stats_dir, self._worker.totals())

    def _dropped(self, data: dict[str, Any]) -> None:
        """A training row this workflow returns nothing for: the trainer's loader must count it consumed
        (cua_rl/trainer/resume.py; ``cua_rl.runs.record_dropped``), or it would pin the restart point for the rest of the run."""
        if not self.is_eval and self.stats_dir and isinstance(data.get(STREAM_KEY), int):
            record_dropped(self.stats_dir, data[STREAM_KEY])

    def _report_advantages(self, outcomes: list[EpisodeOutcome], values: list[float]) -> None:
        """Each trained episode's value (``episode_values``: what its rows carry, each turn its discounted
        share) as its advantage in the monitor."""
        for outcome, value in zip(outcomes, values):
            report = outcome.info.get("monitor_report")
            if report is not None:
                report.advantage(value, len(outcome.turns), self.trajectory.turn_discount)

    def _report_tree_advantages(self, kept: list[EpisodeOutcome], roots, values) -> None:
        """Each tree path's turns with the values their segments train with (a turn its discounted share of its
        segment's), and as the rollout's advantage its last segment's (its leaf's) value."""
        reports = {o.monitor_uuid: o.info.get("monitor_report") for o in kept}
        for segment in walk(roots):   # a path's segments in turn order, its leaf's last
            report = reports.get(segment.monitor_uuid)
            if report is not None:
                report.advantage(values[segment], len(segment.turns), self.trajectory.turn_discount,
                                 first_turn=segment.first_turn)

    def episode_seeds(self, engine, data: dict) -> list[int | None]:
        """The instance seed of each episode of this group (``cua_rl.workflow.seeding``: one for a training
        group, one held-out instance each in an eval group); Nones when seeding is off."""
        if not self.gym.seed_instances:
            return [None] * self.group_size
        return seeding.group_seeds(self.seed, engine, data, self.group_size, is_eval=self.is_eval,
                                   groups_run=self._worker.groups_run)

    def group_seed(self, engine, data: dict) -> int | None:
        """The instance seed of the group's first episode (a training group's one seed)."""
        return self.episode_seeds(engine, data)[0]

    async def _reported_episode(self, engine, endpoint, data: dict, index: int, seed: int | None = None,
                                group: tuple[int, str] | None = None, placement=None) -> EpisodeOutcome | Dropped:
        """``play_episode`` with its monitor rollout record; a crash or a dropped episode is marked failed.
        ``placement``: the group's on a fleet of gym hosts (told of the episode's create)."""
        report = self._report(engine, data, str(data["task_id"]), index, group)
        try:
            outcome = await play_episode(self.episode_setup, endpoint, data, index, report, seed=seed,
                                         placement=placement)
        except BaseException as exc:
            if report is not None and isinstance(exc, asyncio.CancelledError):   # AReaL dropped it (the run
                #  ended), or its gym host drained (the message says which)
                report.cancelled(f"cancelled: {exc}" if str(exc) else
                                 "cancelled: the run stopped while the episode was in flight")
            elif report is not None:
                report.failed(f"{type(exc).__name__}: {exc}")
            raise
        if report is not None and isinstance(outcome, Dropped):
            report.failed(f"episode dropped ({outcome.cause}: {outcome.reason})",
                          {"task_id": str(data["task_id"]), "gym_host": data.get("gym_base_url")})
        if report is not None and isinstance(outcome, EpisodeOutcome):
            outcome.info["monitor_report"] = report
        return outcome


def episode_columns(outcomes: list[EpisodeOutcome], style: str, n_rows: int) -> dict[str, torch.Tensor]:
    """``cua_rl.runs.EPISODE_COLUMNS`` for a group's rows, which ``group_batch`` lays out episode by episode in
    ``outcomes``' order (``rows_of`` each; an episode without a turn has none): per row its episode's gym reward
    (unshaped, unshuffled), success, and 1 / its episode's rows."""
    return _columns([(rows_of(o.turns, style), _gym_reward(o.info, o.reward), float(bool(o.info.get("success"))), 1.0)
                     for o in outcomes], n_rows)


def tree_episode_columns(roots, style: str, n_rows: int) -> dict[str, torch.Tensor]:
    """``episode_columns`` for a tree's rows (``tree_rows``: segment by segment, depth first): a leaf segment's
    rows carry its episode (its gym reward, success and 1 / its rows), an inner segment's the mean of the leaves
    below it with no share, so the step counts each leaf once."""
    blocks = []
    for segment in walk(roots):
        below = leaves([segment])
        blocks.append((rows_of(segment.turns, style, segment.context),
                       sum(_gym_reward(s.info, s.reward) for s in below) / len(below),
                       sum(float(bool(s.info.get("success"))) for s in below) / len(below),
                       0.0 if segment.children else 1.0))
    return _columns(blocks, n_rows)


def _gym_reward(info: dict, reward: float) -> float:
    """An episode's gym reward: unshaped (``env_reward``) and unshuffled (``true_reward``) where it was."""
    return float(info.get("env_reward", info.get("true_reward", reward)))


def _columns(blocks: list[tuple[int, float, float, float]], n_rows: int) -> dict[str, torch.Tensor]:
    """The columns of consecutive blocks of rows, each (rows, reward, success, share of an episode it carries)."""
    reward, success, share = [], [], []
    for n, r, ok, whole in blocks:
        if not n:
            continue
        reward += [r] * n
        success += [ok] * n
        share += [whole / n] * n
    if len(reward) != n_rows:   # a layout this function does not know: report nothing rather than mislabel rows
        raise ValueError(f"episode columns for {len(reward)} rows, the batch has {n_rows}")
    # float64: a share of 1/3 summed over its rows must give the episode back
    return {EPISODE_REWARD: torch.tensor(reward, dtype=torch.float64),
            EPISODE_SUCCESS: torch.tensor(success, dtype=torch.float64),
            EPISODE_SHARE: torch.tensor(share, dtype=torch.float64)}


def path_turns(outcome: EpisodeOutcome) -> int:
    """The turns of an episode's whole path: a tree child's own turns and those its parents played before it."""
    return len(outcome.turns) + int(outcome.info.get("tree_first_turn", 1)) - 1
