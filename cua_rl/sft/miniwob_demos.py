"""Demonstrations of MiniWoB++ tasks for the warm start of issue 85's yardstick: the DOM solvers
(cua_rl/local_gym/miniwob_solvers.py, the same the gym's tests play) recorded as the agent's turns.

Why the DOM solvers: a demonstrator that reads the page is right by construction and needs no planted mistakes;
the warm start's errors are then the model's own (a tiny model reading small text at 480x630 misses often),
which is what the issue asks RL to correct. The solver reads the page in-process (the gym's DevTools
connection), so the demonstrations play on a MiniWoB++ gym started here; every action it takes becomes one
agent turn exactly as ``demos.record_demo`` builds one (``play_turn``: the agent's own prompt of the screen at
that moment, the tool-call reply, parsed back and the parsed action played), then a ``terminate`` turn (a
solver needing more than ``max_turns`` actions is cut there, unterminated, as ``demos.demo_turns`` cuts). A
demonstration is kept only when the page scores it 1.0 (``record_demos``' rule). Only the tasks named (the
yardstick's train tasks) are demonstrated; a task without a solver is refused before anything plays.
"""

from __future__ import annotations

import asyncio
import logging

from ..genv import GenvClient
from ..local_agent.formats import HistoryStep, get_format
from ..local_gym.miniwob_solvers import SOLVERS, Play
from .demos import Demonstration, play_turn, prompt_context, reply_writer

logger = logging.getLogger(__name__)


class TurnLimit(Exception):
    """The solver needed more actions than the agent's turn limit: the demonstration stops there, unterminated."""


class DemoPlay(Play):
    """A ``Play`` whose every action is one recorded agent turn (``play_turn``) instead of a bare HTTP action."""

    def __init__(self, client: GenvClient, eid: str, desktop, utterance: str, demo: Demonstration, fmt, write, ctx,
                 max_turns: int | None) -> None:
        super().__init__(client, eid, desktop, utterance)
        self.demo, self.fmt, self.write, self.ctx, self.max_turns = demo, fmt, write, ctx, max_turns
        self.history: list[HistoryStep] = []

    async def act(self, action: dict | None) -> None:
        """One turn playing ``action``; None is the final terminate turn."""
        if action is not None and self.max_turns is not None and len(self.demo.turns) >= self.max_turns:
            raise TurnLimit
        self.demo.turns.append(await play_turn(self.client, self.eid, self.fmt, self.write, self.ctx, self.history,
                                               action, f"{self.demo.task_id} seed {self.demo.seed}"))


async def _settled_reward(client: GenvClient, eid: str, tries: int = 25) -> float:
    """The page's score once it says the episode is done (a page may end it a moment after the last click)."""
    for _ in range(tries):
        result = await client.evaluate(eid)
        if result.raw["result"]["miniwob"]["done"]:
            break
        await asyncio.sleep(0.02)
    return result.reward


async def record_miniwob_demo(client: GenvClient, gym, task: str, seed: int, agent: str = "qwen3-vl",
                              history_images: int = 3, max_turns: int | None = None) -> Demonstration:
    """``task``'s DOM solver at ``seed`` on the in-process MiniWoB++ gym ``gym``, one agent turn per action, then
    terminate (not past ``max_turns``: the agent would stop there too)."""
    fmt, write = get_format(agent), reply_writer(agent)
    async with client.execution(task, {"seed": seed}) as ex:
        ctx = await prompt_context(client, ex, task, history_images)
        demo = Demonstration(task, seed, ctx.instruction)
        play = DemoPlay(client, ex.execution_id, gym.manager.executions[ex.execution_id].desktop, ctx.instruction,
                        demo, fmt, write, ctx, max_turns)
        try:
            await SOLVERS[task](play)
        except TurnLimit:   # cut at the limit, unterminated, as demos.demo_turns cuts a scripted play
            logger.info("%s seed %d: the solver needs more than %s turns; the demonstration stops there", task, seed,
                        max_turns)
        else:   # terminate, as a solving agent ends its run (kept past the limit, as demos.demo_turns keeps it)
            await play.act(None)
        demo.reward = await _settled_reward(client, ex.execution_id)
    return demo


async def record_miniwob_demos(gym, tasks: list[str], seeds: list[int], agent: str = "qwen3-vl",
                               history_images: int = 3, concurrency: int = 2,
                               max_turns: int | None = None) -> list[Demonstration]:
    """Demonstrations of every task at every seed that the page scores 1.0 (the others are logged and left out).
    ``gym``: a MiniWoB++ gym server started in this process (``start_gym_server(gym_id="miniwob")``)."""
    missing = [t for t in tasks if t not in SOLVERS]
    if missing:
        raise ValueError(f"no DOM solver for MiniWoB++ task(s) {missing}; solvers: {sorted(SOLVERS)}")
    sem = asyncio.Semaphore(concurrency)
    total, done = len(tasks) * len(seeds), 0
    async with GenvClient(gym.url, gym.gym_id) as client:
        async def one(task: str, seed: int) -> Demonstration:
            nonlocal done
            async with sem:
                demo = await record_miniwob_demo(client, gym, task, seed, agent, history_images, max_turns)
            done += 1
            if done % max(1, total // 8) == 0 or done == total:   # about 8 progress lines
                logger.info("recorded %d/%d demonstrations", done, total)
            return demo
        demos = await asyncio.gather(*(one(t, s) for t in tasks for s in seeds))
    for d in demos:
        if d.reward != 1.0:
            logger.warning("demonstration %s seed %d scored %.2f; left out", d.task_id, d.seed, d.reward)
    return [d for d in demos if d.reward == 1.0]
