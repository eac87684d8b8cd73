"""Tree groups: one AReaL item is one tree of episodes on forked desktops (docs/learning.md, "Tree groups").

The workflow's ``group_size`` roots play the group's instance, each on a desktop of its own. Every path that
reaches a turn of ``tree.branch_turns`` is held there (its model call for that turn waits:
``PolicyEndpoint.hold``) while the gym forks its desktop (``GenvClient.fork``) into ``tree.branches`` children;
each child's agent run continues the path's history on its own desktop (``startFrom``: the parent's run after
``turn - 1`` steps), and then the parent is let go. So the parent and its children sample that turn from the same
screen and prompt, and play on to their own ends. With ``tree.choose`` unsure the turns are candidates: the call
is held after its action is sampled (the agent has not acted yet), and the path forks only where the policy was
unsure of that action (the surprisal of its least sure sampled token at least ``tree.min_surprisal``), within
``tree.fork_budget`` forks per group; the others are skipped (counted). Every path's execution is evaluated (its
leaf's reward) and terminated. A fork the gym refuses, or cannot fit within ``tree.fork_wait_seconds``, is no branch (counted), not a
lost group; so is a child whose first prompt is not its parent's held prompt, token for token and pixel for pixel
(a late paint, or a difference inside a task's masked regions, gave it another screen): it is played and counted,
not trained. A child's seconds (its desktop time) count from the fork that made its desktop.

``TreePlayer.play`` returns the played paths (``TreePlay``); ``segments`` cuts them into the segments the credit
is computed on (``cua_rl.trajectory.tree``): a path's turns are cut at each branch point that kept an evaluated
child. A path the infrastructure failed (``Dropped``) takes its subtree with it: each of its paths counts as a lost
episode of that cause. An agent service that cannot continue a run (no ``startFrom`` in its ``/health``
features, as a stock gbox-mini-agent) is refused before the first tree plays (``TreeRefused``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from cua_rl.config import TreeConfig
from cua_rl.genv import GenvClient, GenvError
from cua_rl.mini_agent import START_FROM, MiniAgentClient, MiniAgentError, StartFrom
from cua_rl.monitor import RolloutReport
from cua_rl.runs import DropCause
from cua_rl.trajectory import EpisodeOutcome
from cua_rl.trajectory.tree import Segment

from .episode import Dropped, EpisodeSetup, PathHooks, _dropped_by, play_on

logger = logging.getLogger(__name__)


class TreeRefused(RuntimeError):
    """Tree groups cannot run against this agent service or gym (the message says what is missing)."""


@dataclass(eq=False)
class PlayedPath:
    """One execution's play in a tree: from turn ``first_turn`` of the tree's path (1 for a root) to its end;
    ``branches``: (turn, children) for each branch point where its desktop was forked."""

    first_turn: int
    index: int
    outcome: EpisodeOutcome | Dropped | None = None
    branches: list[tuple[int, list["PlayedPath"]]] = field(default_factory=list)
    # per forked turn, the turns its endpoint episode had recorded when the gym forked it (turn - first_turn:
    # its call for that turn was still held, so the children start from the screen the parent decides on)
    recorded_at_fork: dict[int, int] = field(default_factory=dict)
    # ``tree.choose`` unsure: per candidate turn it reached, its held call's largest surprisal (nats, -logprob of its
    # least sure sampled token)
    surprisal: dict[int, float] = field(default_factory=dict)

    @property
    def evaluated(self) -> bool:
        return isinstance(self.outcome, EpisodeOutcome)


@dataclass
class TreePlay:
    """What a tree's play left: its root paths, the branch points forked and those the gym refused."""

    roots: list[PlayedPath]
    forks: int = 0
    forks_failed: int = 0
    # children whose first prompt was not their parent's held one: no branch; their paths' turns were still played
    forks_unmatched: int = 0
    unmatched_turns: int = 0
    # ``tree.choose`` unsure: candidate turns where no fork was made (the policy sure enough, or no budget left)
    forks_skipped: int = 0
    # actions the gym played again to make the forked children (a replayed fork: X11 and browser desktops, each
    # child its parent's actions; a VM's snapshot replays none): environment steps a comparison must count
    replayed_actions: int = 0

    def paths(self) -> Iterator[PlayedPath]:
        stack = list(reversed(self.roots))
        while stack:
            path = stack.pop()
            yield path
            stack.extend(kid for _, kids in reversed(path.branches) for kid in reversed(kids))

    def kept(self) -> list[EpisodeOutcome]:
        """The evaluated paths whose ancestors were all evaluated: one leaf each (the tree's episodes)."""
        out: list[EpisodeOutcome] = []
        stack = [r for r in self.roots if r.evaluated]
        while stack:
            path = stack.pop(0)
            out.append(path.outcome)
            stack.extend(kid for _, kids in path.branches for kid in kids if kid.evaluated)
        return out

    def lost(self) -> list[DropCause]:
        """The cause of every path that is not kept: its own drop, or its nearest dropped ancestor's."""
        causes: list[DropCause] = []

        def visit(path: PlayedPath, inherited: DropCause | None) -> None:
            cause = inherited or (None if path.evaluated else getattr(path.outcome, "cause", DropCause.CRASH))
            if cause:
                causes.append(cause)
            for _, kids in path.branches:
                for kid in kids:
                    visit(kid, cause)

        for root in self.roots:
            visit(root, None)
        return causes


def segments(play: TreePlay) -> list[Segment]:
    """The kept roots as segments (module docstring): cut at every branch point with an evaluated child."""
    return [_segment(root, root.first_turn, []) for root in play.roots if root.evaluated]


def _segment(path: PlayedPath, start: int, context: list) -> Segment:
    out = path.outcome
    own_from = start - path.first_turn                # its turns before ``start`` belong to earlier segments
    live = [(turn, [k for k in kids if k.evaluated]) for turn, kids in path.branches if turn > start]
    live = [(turn, kids) for turn, kids in live if kids]
    uuid = out.monitor_uuid
    if not live:
        return Segment(turns=out.turns[own_from:], context=list(context), reward=out.reward, monitor_uuid=uuid,
                       first_turn=own_from + 1, info=out.info)
    turn, kids = live[0]
    own = out.turns[own_from:turn - path.first_turn]
    below = [*context, *own]
    segment = Segment(turns=own, context=list(context), monitor_uuid=uuid, first_turn=own_from + 1)
    segment.children = [_segment(path, turn, below), *(_segment(kid, turn, below) for kid in kids)]
    return segment


async def check_agent(agent_url: str) -> None:
    """Refuse an agent service that cannot continue another run (``TreeRefused``)."""
    try:
        async with MiniAgentClient(agent_url) as agent:
            features = await agent.features()
    except MiniAgentError as exc:
        raise TreeRefused(f"tree groups: the agent service at {agent_url} did not answer /health: {exc}") from exc
    if START_FROM not in features:
        raise TreeRefused(f"tree groups need an agent service that continues another run's history "
                          f"({START_FROM!r} in its /health features; our agent service has it: docs/local_agent.md); "
                          f"the one at {agent_url} lists {features or 'none'}. Turn tree groups off (tree.enabled=false) "
                          f"or use --agent embedded")


class TreePlayer:
    """Plays one tree (module docstring). ``report_for(index, path)``: the monitor's record of a path's rollout
    (None: not reported); ``seed``: the group's instance."""

    def __init__(self, setup: EpisodeSetup, tree: TreeConfig, endpoint, data: dict, gym_url: str, gym_id: str,
                 report_for: Callable[[int], RolloutReport | None], seed: int | None) -> None:
        self.setup, self.tree, self.endpoint, self.data = setup, tree, endpoint, data
        self.gym_url, self.gym_id, self.report_for, self.seed = gym_url, gym_id, report_for, seed
        self._next_index = 0
        self._play = TreePlay([])
        self._unsure = tree.choose == "unsure"
        self._budget = tree.fork_budget   # forks this group may still make (choose unsure)

    def _index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    async def play(self, roots: int) -> TreePlay:
        self._play.roots = [PlayedPath(1, self._index()) for _ in range(roots)]
        async with GenvClient(self.gym_url, self.gym_id) as gym:
            await asyncio.gather(*(self._root(gym, path) for path in self._play.roots))
        return self._play

    async def _root(self, gym: GenvClient, path: PlayedPath) -> None:
        options = {"seed": self.seed} if self.seed is not None else None
        started = time.monotonic()   # a root's seconds count its create's wait, as a plain episode's do
        try:
            async with gym.execution(str(self.data["task_id"]), options,
                                     busy_wait_s=self.setup.limits.max_task_time_seconds) as execution:
                await self._path(gym, path, execution, None, None, started)
        except (GenvError, MiniAgentError) as exc:
            path.outcome = _dropped_by(exc, f"task {self.data['task_id']} tree path {path.index}", self.gym_url)

    async def _child(self, gym: GenvClient, path: PlayedPath, execution, start: StartFrom,
                     parent: str | None, began: float) -> None:
        try:
            try:
                await self._path(gym, path, execution, start, parent, began)
            finally:
                try:
                    await asyncio.shield(gym.terminate(execution.execution_id))
                except (GenvError, asyncio.CancelledError) as exc:
                    logger.error("could not terminate forked execution %s: %s", execution.execution_id, exc)
        except (GenvError, MiniAgentError) as exc:
            path.outcome = _dropped_by(exc, f"task {self.data['task_id']} tree path {path.index}", self.gym_url)

    async def _path(self, gym: GenvClient, path: PlayedPath, execution, start: StartFrom | None,
                    parent: str | None, started: float | None = None) -> None:
        """Play ``execution`` from ``path.first_turn``, forking it at each branch turn the path reaches.
        ``parent``: the monitor's rollout of the path it was forked from (its summary names it, and the turn)."""
        turns = [t for t in self.tree.branch_turns if t > path.first_turn]
        held: dict[str, object] = {}
        run_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        opened = asyncio.Event()

        def on_episode(episode) -> None:
            held["episode"] = episode
            if turns:
                held["hold"] = self.endpoint.hold(episode, turns[0] - path.first_turn + 1, sampled=self._unsure)
            opened.set()

        def on_started(rid: str) -> None:
            if not run_id.done():
                run_id.set_result(rid)

        report = self.report_for(path.index)
        hooks = PathHooks(start_from=start, on_episode=on_episode, on_started=on_started,
                          info={"tree_path": path.index, "tree_first_turn": path.first_turn,
                                **({"tree_parent": parent} if parent else {})})
        play = asyncio.create_task(play_on(self.setup, self.endpoint, self.data, path.index, gym, execution, report,
                                           seed=self.seed, hooks=hooks, started=started))
        children: list[asyncio.Task] = []
        try:
            if turns:
                await _first(opened.wait(), play)   # the episode is open (its hold set) or the play failed first
            for n, turn in enumerate(turns):
                hold = held.get("hold")
                if hold is None or not await _arrives(hold, play, self.setup.limits.max_task_time_seconds):
                    break
                if self._forks_at(path, turn, hold):
                    path.recorded_at_fork[turn] = len(held["episode"].turns)
                    fork_from = StartFrom(run_id=run_id.result(), steps=turn - 1, api_key=held["episode"].key)
                    kids = await self._fork(gym, execution, fork_from, turn,
                                            report.uuid if report is not None else None)
                    if kids:
                        path.branches.append((turn, [kid for kid, _ in kids]))
                        children += [task for _, task in kids]
                later = turns[n + 1] if n + 1 < len(turns) else None
                held["hold"] = (self.endpoint.hold(held["episode"], later - path.first_turn + 1, sampled=self._unsure)
                                if later is not None else None)
                hold.release()
            path.outcome = await play
            if report is not None and path.evaluated:   # the workflow reports its advantages through it
                path.outcome.info["monitor_report"] = report
            await asyncio.gather(*children, return_exceptions=True)
            self._unmatched_out(path)
        finally:
            stray = [t for t in (play, *children) if not t.done()]
            for task in stray:   # this path failed or was cancelled: its subtree goes with it
                task.cancel()
            if stray:
                await asyncio.gather(*stray, return_exceptions=True)

    def _forks_at(self, path: PlayedPath, turn: int, hold) -> bool:
        """Whether ``path`` forks at ``turn``, its call held there: always with ``tree.choose`` every; with unsure,
        when a token of the action the policy sampled in the held call had a surprisal of at least
        ``tree.min_surprisal`` and the group has forks left (``tree.fork_budget``), else counted as skipped. The
        largest, not the mean: an action's other tokens are its format, which a warm-started policy is sure of (the
        pinned multiturn warm start's mean per token was below 0.0001 nats at the median of 77 calls, 0.037 at
        most), so the mean hides the decision."""
        if not self._unsure:
            return True
        logprobs = hold.sampled.output_logprobs if hold.sampled is not None else []
        if logprobs:
            path.surprisal[turn] = -min(logprobs)
        if logprobs and path.surprisal[turn] >= self.tree.min_surprisal and self._budget > 0:
            self._budget -= 1
            return True
        self._play.forks_skipped += 1
        return False

    def _unmatched_out(self, path: PlayedPath) -> None:
        """Take out of ``path``'s branches each evaluated child whose first prompt is not the parent's held prompt
        at the fork (``same_prompt``): no branch, counted (``forks_unmatched``), its subtree's turns counted as
        played (``unmatched_turns``). Only an evaluated parent is checked (a dropped one takes its subtree)."""
        if not path.evaluated:
            return
        kept = []
        for turn, kids in path.branches:
            at = path.recorded_at_fork[turn]   # set at every fork: the held turn's index among the path's
            held = path.outcome.turns[at] if at < len(path.outcome.turns) else None
            for kid in [k for k in kids if k.evaluated]:
                first = kid.outcome.turns[0] if kid.outcome.turns else None
                if held is not None and first is not None and same_prompt(held, first):
                    continue
                kids.remove(kid)
                self._play.forks_unmatched += 1
                self._play.unmatched_turns += sum(len(p.outcome.turns) for p in TreePlay([kid]).paths()
                                                   if p.evaluated)
                logger.warning("task %s: tree path %d's child %d at turn %d is no branch: %s", self.data["task_id"],
                               path.index, kid.index, turn,
                               "a first prompt other than its parent's held one (another screen or history)"
                               if held is not None and first is not None else
                               "its parent's held turn or its own first turn was not recorded")
            if kids:
                kept.append((turn, kids))
        path.branches = kept

    async def _fork(self, gym: GenvClient, execution, start: StartFrom, turn: int, parent: str | None):
        """The forked children of ``execution`` before ``turn`` and the tasks playing them, each continuing the
        parent's run from ``start`` (its run, steps and model key); [] when the gym refused the fork or had no
        room for it within ``tree.fork_wait_seconds`` (no branch, counted). A child's seconds count from here."""
        began = time.monotonic()
        try:
            fork = await gym.fork(execution.execution_id, self.tree.branches, busy_wait_s=self.tree.fork_wait_seconds)
        except GenvError as exc:
            self._play.forks_failed += 1
            logger.warning("task %s: no branch at turn %d of execution %s: the fork failed: %s", self.data["task_id"],
                           turn, execution.execution_id, exc)
            return []
        self._play.forks += 1
        if fork.raw.get("mechanism") == "replay" and isinstance(fork.raw.get("actions"), int):
            self._play.replayed_actions += fork.raw["actions"] * len(fork.executions)
        out = []
        for child in fork.executions:
            if child.instruction is None:   # the continuation must be told its parent's task, word for word
                child = dataclasses.replace(child, instruction=execution.instruction)
            kid = PlayedPath(turn, self._index())
            out.append((kid, asyncio.create_task(self._child(gym, kid, child, start, parent, began))))
        return out


def same_prompt(held, first) -> bool:
    """Whether a child's first turn was sampled from its parent's held prompt: the same token ids and the same
    images (every ``multi_modal_input`` tensor equal)."""
    if held.prompt_ids != first.prompt_ids:
        return False
    a, b = held.multi_modal_input or {}, first.multi_modal_input or {}
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def _arrives(hold, play: asyncio.Task, timeout_s: float) -> bool:
    """Whether the held call came before the path's play ended (a path that ends earlier has no branch)."""
    return bool(await _first(hold.arrived(timeout_s), play))


async def _first(awaitable, play: asyncio.Task):
    """``awaitable``'s result if it finishes before ``play`` does, else None (it is cancelled)."""
    waiter = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({waiter, play}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        return waiter.result()
    waiter.cancel()
    return None
