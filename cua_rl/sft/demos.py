"""Demonstrations: the curriculum's scripted solutions played on real desktops, recorded as the agent's turns.

Why re-render rather than invent a format: a warm start only helps RL if the model is trained on exactly the
prompts it will see. Every turn here is built by the agent's own prompt format (``local_agent.formats``:
system prompt with the tool schema, task text, screenshot as a PNG data URL, bounded history with the
earlier replies), from the screenshot the gym shows at that moment, with the same ``PromptContext`` the
agent service fills in (instruction from the create reply, screen size, pointer). The reply is the tool
call that performs the scripted action; it is parsed back by the same format and the *parsed* action is
what the desktop executes, so a reply the agent could not run never becomes a demonstration. The last turn
ends the run (``terminate`` success), as a solving agent would. A demonstration is kept only when the gym
scores it 1.0.

An imperfect demonstrator (``error_rate`` > 0, ``sft.demo_error_rate``): that fraction of the
demonstrations, chosen by seed, plays a well-formed wrong solution instead (``curriculum.wrong_solutions``:
another key, another cell) and is kept although it fails, as a human demonstrator's slips would be. A model
imitating them picks the right action only part of the time; that is what RL can then correct.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from ..genv import GenvClient
from ..local_agent.formats import HistoryStep, PromptContext, get_format
from ..local_agent.runner import png_data_url
from ..local_gym.curriculum import make_instance, wrong_solutions

logger = logging.getLogger(__name__)


@dataclass
class DemoTurn:
    messages: list[dict[str, Any]]     # the chat messages the agent would send for this turn
    reply: str                         # the assistant reply that performs the scripted action


@dataclass
class Demonstration:
    task_id: str
    seed: int
    instruction: str
    turns: list[DemoTurn] = field(default_factory=list)
    reward: float = 0.0
    erroneous: bool = False            # played a wrong solution on purpose (imperfect demonstrator)


def _qwen_call(arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": arguments}) + "\n</tool_call>"


def qwen3_vl_reply(action: dict[str, Any] | None) -> str:
    """The qwen3-vl tool call for one gym action (0..1000 grid); ``None`` ends the run with success."""
    if action is None:
        return _qwen_call({"action": "terminate", "status": "success"})
    kind = action["type"]
    if kind == "click":
        return _qwen_call({"action": "left_click", "coordinate": [round(action["x"] * 1000), round(action["y"] * 1000)]})
    if kind == "type":
        return _qwen_call({"action": "type", "text": action["text"]})
    if kind == "key":
        return _qwen_call({"action": "key", "keys": list(action["keys"])})
    raise ValueError(f"no qwen3-vl reply for gym action {action!r}")


REPLY_WRITERS = {"qwen3-vl": qwen3_vl_reply}


def reply_writer(agent: str):
    try:
        return REPLY_WRITERS[agent]
    except KeyError:
        raise ValueError(f"demonstrations are written for agents {sorted(REPLY_WRITERS)}, not {agent!r}") from None


def demo_actions(instance, error_rate: float) -> tuple[tuple[dict, ...], bool]:
    """The actions a demonstrator with ``error_rate`` plays on ``instance``, and whether they are a wrong
    solution; decided by the seed, so the same demonstrations come back every time."""
    wrong = wrong_solutions(instance)
    rng = random.Random(f"demo-error:{instance.family}:{instance.seed}")
    if wrong and rng.random() < error_rate:
        return rng.choice(wrong), True
    return instance.solution, False


def demo_turns(actions: tuple[dict, ...], max_turns: int | None) -> list[dict | None]:
    """The turns a demonstrator plays: its actions, then ``terminate`` (None). A play longer than the agent's
    turn limit is cut there and never terminates, as the agent would stop it. A play that fits keeps its
    terminate turn even when that turn is past the limit (key-colour at ``max_turns: 1``: the warm start its
    learning gate was measured on)."""
    if max_turns is not None and len(actions) > max_turns:
        return list(actions[:max_turns])
    return [*actions, None]


async def record_demo(client: GenvClient, task, seed: int, agent: str = "qwen3-vl",
                      history_images: int = 3, error_rate: float = 0.0,
                      max_turns: int | None = None) -> Demonstration:
    """Play the scripted solution of ``task`` (a curriculum family task) at ``seed``, one agent turn per action
    (a wrong one instead with probability ``error_rate``, where the family has wrong solutions), cut at
    ``max_turns`` (``demo_turns``)."""
    fmt, write = get_format(agent), reply_writer(agent)
    instance = make_instance(task.family, seed)
    actions, erroneous = demo_actions(instance, error_rate)
    async with client.execution(task.task_id, {"seed": seed}) as ex:
        eid = ex.execution_id
        ctx = await prompt_context(client, ex, task.instruction, history_images)
        demo = Demonstration(task.task_id, seed, ctx.instruction, erroneous=erroneous)
        history: list[HistoryStep] = []
        for action in demo_turns(actions, max_turns):
            demo.turns.append(await play_turn(client, eid, fmt, write, ctx, history, action,
                                              f"{task.task_id} seed {seed}"))
        demo.reward = (await client.evaluate(eid)).reward
    return demo


async def prompt_context(client: GenvClient, ex, fallback_instruction: str, history_images: int) -> PromptContext:
    """The ``PromptContext`` the agent service fills in for an execution: the create reply's instruction and the
    screen size."""
    screen = (await client.get_execution(ex.execution_id)).get("screen", {})
    return PromptContext(instruction=ex.instruction or fallback_instruction, space="pc", history_images=history_images,
                         screen=(int(screen.get("width") or 0), int(screen.get("height") or 0)))


async def play_turn(client: GenvClient, eid: str, fmt, write, ctx: PromptContext, history: list[HistoryStep],
                    action: dict | None, label: str) -> DemoTurn:
    """One agent turn of a demonstration: the prompt the agent would build from the screen now, the reply that
    performs ``action`` (None: terminate), parsed back by the same format and the *parsed* action played."""
    shot = png_data_url(await client.screenshot(eid))
    messages = fmt.build_messages(ctx, history, shot, None)
    reply = write(action)
    turn = fmt.parse({"role": "assistant", "content": reply}, ctx)
    for parsed in turn.actions:
        if parsed.gym_action is not None:
            result = await client.act(eid, parsed.gym_action)
            if not result.get("ok"):
                raise RuntimeError(f"{label}: action {parsed.gym_action} failed: {result}")
        if parsed.pointer is not None:
            ctx.pointer = parsed.pointer
    history.append(HistoryStep(step=len(history) + 1, screenshot=shot, feedback=None, reply=reply,
                               summary=fmt.summarize(turn)))
    return DemoTurn(messages, reply)


async def record_demos(gym_url: str, gym_id: str, tasks: list, seeds: list[int], agent: str = "qwen3-vl",
                       history_images: int = 3, concurrency: int = 2, error_rate: float = 0.0,
                       max_turns: int | None = None) -> list[Demonstration]:
    """Demonstrations of every task at every seed that the gym scores 1.0 (the others are logged and left
    out), plus the wrong ones played on purpose (``error_rate``)."""
    sem = asyncio.Semaphore(concurrency)
    total, done = len(tasks) * len(seeds), 0
    async with GenvClient(gym_url, gym_id) as client:
        async def one(task, seed):
            nonlocal done
            async with sem:
                demo = await record_demo(client, task, seed, agent, history_images, error_rate, max_turns)
            done += 1
            if done % max(1, total // 8) == 0 or done == total:   # about 8 progress lines
                logger.info("recorded %d/%d demonstrations", done, total)
            return demo
        demos = await asyncio.gather(*(one(t, s) for t in tasks for s in seeds))
    kept = [d for d in demos if d.reward == 1.0 or d.erroneous]
    for d in demos:
        if d.reward != 1.0 and not d.erroneous:
            logger.warning("demonstration %s seed %d scored %.2f; left out", d.task_id, d.seed, d.reward)
    return kept
