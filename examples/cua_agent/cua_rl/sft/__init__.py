"""Warm start by supervised fine-tuning: scripted-solution demonstrations of the seeded curriculum, rendered in
the agent's prompt format, turned into RL-identical rows and trained with AReaL's SFT engine.

``python -m cua_rl.sft --config examples/cua_agent/config.cpu.yaml [key=value ...]`` (the ``sft:`` section of
``CUAConfig``). Pieces: ``demos`` (record), ``rows`` (rows through the policy's prompt path), ``train``.
"""

from .demos import Demonstration, DemoTurn, qwen3_vl_reply, record_demo, record_demos
from .rows import demo_rows, demo_turn, reply_ids
from .train import SFTResult, train_rows

__all__ = ["Demonstration", "DemoTurn", "qwen3_vl_reply", "record_demo", "record_demos", "demo_rows", "demo_turn",
           "reply_ids", "SFTResult", "train_rows"]
