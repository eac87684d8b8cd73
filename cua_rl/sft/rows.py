"""Demonstrations -> training rows, through the policy endpoint's prompt path and the RL row builder.

Why no row format of its own: a demonstration turn becomes a ``policy.records.Turn`` exactly as a policy
turn does (prompt ids, ``mm_token_type_ids`` and image tensors from ``policy.prompt_from_messages``, the
function behind every chat completion the endpoint answers), and ``trajectory.episode_rows`` turns it into
the same tensor dict an RL row is: prompt masked out, the reply (its tokens plus the end-of-turn token the
model stops with) masked in. So the loss is on the assistant's reply only, and SFT and RL train on
identical prompts.
"""

from __future__ import annotations

from typing import Any

from ..policy import EndpointSettings, Turn, prompt_from_messages
from ..trajectory import episode_rows
from .demos import Demonstration, DemoTurn


def reply_ids(tokenizer, reply: str) -> list[int]:
    """The reply's tokens as the model would emit them: the text, then the end-of-turn (eos) token."""
    return list(tokenizer(reply, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def demo_turn(processor, tokenizer, settings: EndpointSettings, turn: DemoTurn) -> Turn:
    prompt = prompt_from_messages(processor, tokenizer, settings, turn.messages)
    out = reply_ids(tokenizer, turn.reply)
    # Demonstrations have no behaviour policy: logprob 0 and version 0 (SFT reads neither).
    return Turn(prompt_ids=prompt.input_ids, output_ids=out, output_logprobs=[0.0] * len(out),
                output_versions=[0] * len(out), prompt_mm_token_type_ids=prompt.mm_token_type_ids,
                multi_modal_input=prompt.multi_modal_input, n_images=len(prompt.images))


def demo_rows(processor, tokenizer, settings: EndpointSettings, demo: Demonstration,
              style: str = "individual") -> list[dict[str, Any]]:
    """The demonstration's rows in RL's export style (``trajectory.export_style``: one row per turn, or one
    per episode when its prompts chain), reward = the demonstration's score."""
    turns = [demo_turn(processor, tokenizer, settings, t) for t in demo.turns]
    return episode_rows(turns, demo.reward, style=style)
