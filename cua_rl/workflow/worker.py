"""What one rollout worker process keeps for the workflows it runs, per kind ("train" or "eval").

Why: AReaL builds a new ``CUAAgentWorkflow`` for every submitted task (``RemoteInfEngine._resolve_workflow``
calls the class with the config's kwargs), so a workflow object lives for one group. What must outlive a
group lives here, once per process and kind, and the workflow objects stay cheap shells:

- the policy endpoint: one per engine and settings, with the processor and tokenizer it was built with (it
  was one per group: a new endpoint object, its checks and their warnings every group);
- the counts the launcher's summary reads: episodes evaluated and lost, groups rejected, and the endpoint's
  turn counts (they were a process-wide list that grew by one endpoint per group);
- the groups started per task and policy version (instance seeds of rows without a stream index and of eval
  groups, ``cua_rl.workflow.seeding``), the groups started in all with a token of this process (the identity of
  a group without a stream index, ``CUAAgentWorkflow.group_identity``) and the endpoint URLs already logged.

``forget_workers`` drops it all, as a fresh process starts (tests that play several processes in one).
"""

from __future__ import annotations

import collections
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from cua_rl.genv.fleet import DRAINS
from cua_rl.runs import DropCause, host_key
from cua_rl.trajectory import trained_tokens

logger = logging.getLogger(__name__)


@dataclass
class WorkerState:
    kind: str
    # episodes_evaluated, episodes_lost (and episodes_lost_<cause>), groups_rejected, groups_zero_variance;
    # tree_forks, tree_forks_failed, tree_forks_unmatched and tree_forks_skipped (tree groups' branch points;
    # children no branch; candidate turns where the policy was sure enough or the budget was spent),
    # env_steps_replayed (their forks' replayed actions, counted in env_steps too);
    # env_steps, desktop_ms and trained_tokens of the evaluated episodes (count_use); groups_drained and
    # episodes_drained (count_drained); per gym host (runs.host_key) its episodes, drains and drained groups
    episodes: collections.Counter[str] = field(default_factory=collections.Counter)
    # training groups started per (task, policy version): the nth of their seeds (rows without a stream index)
    groups_run: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    announced: set[str] = field(default_factory=set)      # endpoint URLs logged (what a multi-host run must know)
    token: str = field(default_factory=lambda: secrets.token_hex(3))   # this process, in group ids
    groups_started: int = 0
    tree_agent_checked: bool = False   # tree groups: the agent service continues runs (workflow/tree.check_agent)
    _endpoints: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)   # key -> (engine, endpoint)
    _retired: collections.Counter[str] = field(default_factory=collections.Counter)

    def endpoint(self, engine, key: tuple, build: Callable[[], Any]):
        """The endpoint for ``engine`` and ``key`` (its model and settings), built by ``build`` the first time;
        one whose engine was replaced is rebuilt (its turn counts stay in the totals)."""
        entry = self._endpoints.get(key)
        if entry is not None and entry[0] is engine:
            return entry[1]
        if entry is not None:
            self._retired.update(entry[1].totals)
        endpoint = build()
        self._endpoints[key] = (engine, endpoint)
        logger.info("%s workflow: policy endpoint built for %s (%d in this process)", self.kind,
                    type(engine).__name__, len(self._endpoints))
        return endpoint

    def next_group(self) -> int:
        """The number of the next group this worker starts (0, 1, ...)."""
        self.groups_started += 1
        return self.groups_started - 1

    def count_group(self, evaluated: int, lost_causes: list[DropCause], rejected: bool) -> None:
        """One group's episodes: how many were evaluated, the cause of each one lost, whether it was rejected."""
        self.episodes["episodes_evaluated"] += evaluated
        self.episodes["episodes_lost"] += len(lost_causes)
        for cause in lost_causes:
            self.episodes[f"episodes_lost_{cause}"] += 1
        self.episodes["groups_rejected"] += rejected

    def count_drained(self, url: str, episodes: int) -> None:
        """A group dropped because its gym host drained (played again elsewhere): never a lost episode."""
        self.episodes["groups_drained"] += 1
        self.episodes["episodes_drained"] += episodes
        self.episodes[host_key(url, "groups_drained")] += 1
        self.episodes[host_key(url, "episodes_drained")] += episodes

    def count_use(self, outcomes: list) -> None:
        """What a group's evaluated episodes used (the learning bench's ``method_comparison``): environment steps
        (policy turns, each one action or the final answer), desktop time (milliseconds, execution created to
        evaluated) and the trained (output) tokens; and the gym host each played on."""
        for o in outcomes:
            if o.info.get("gym_host"):
                self.episodes[host_key(o.info["gym_host"], "episodes")] += 1
            self.count_faults(o.info)
            self.episodes["env_steps"] += len(o.turns)
            self.episodes["desktop_ms"] += int(1000 * o.info.get("seconds", 0.0))
            self.episodes["trained_tokens"] += trained_tokens(o)

    def count_faults(self, info: dict) -> None:
        """An evaluated episode's gym faults it recovered from (counted, not dropped:
        ``cua_rl.workflow.episode.gym_fault_decided``); on a gym that sends no ``faults`` (docs/protocols.md 1.4),
        the episode, and its run's failure by kind (the agent's ``failure``, or ``unreported``): nothing told
        the gym's failures from the policy's, and these were trained as the policy's."""
        if info.get("gym_faults_recovered"):
            self.episodes["episodes_gym_faults_recovered"] += 1
            self.episodes["gym_faults_recovered"] += int(info["gym_faults_recovered"])
        if info.get("gym_counts_faults") is False:
            self.episodes["episodes_gym_without_faults"] += 1
            if info.get("run_failure"):
                self.episodes[f"episodes_gym_without_faults_failed_{info['run_failure']}"] += 1

    def totals(self) -> dict[str, int]:
        """This worker's episode counts and its endpoints' turn counts, summed; each gym host's drains."""
        out = collections.Counter(self.episodes)
        out.update(self._retired)
        if self.kind == "train" or "train" not in _WORKERS:   # the process's drains, written once
            out.update({host_key(url, "drains"): n for url, n in DRAINS.items()})
        for _, endpoint in self._endpoints.values():
            out.update(endpoint.totals)
        return dict(out)


_WORKERS: dict[str, WorkerState] = {}


def worker_state(kind: str) -> WorkerState:
    """This process's state for workflows of ``kind`` ("train" or "eval")."""
    state = _WORKERS.get(kind)
    if state is None:
        state = _WORKERS[kind] = WorkerState(kind)
    return state


def forget_workers() -> None:
    """Drop every kind's state, as a fresh process starts (tests)."""
    _WORKERS.clear()
