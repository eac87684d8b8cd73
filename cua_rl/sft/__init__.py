"""Warm start by supervised fine-tuning: scripted-solution demonstrations of the seeded curriculum, rendered in
the agent's prompt format, turned into RL-identical rows and trained with AReaL's SFT engine.

``python -m cua_rl.sft --config examples/cua_agent/config.cpu.yaml [key=value ...]`` (the ``sft:`` section of
``CUAConfig``). Pieces: ``demos`` (record), ``rows`` (rows through the policy's prompt path), ``train``.
"""

from ..logs import keep_stdlib_logging

# Before the imports below pull in areal: a logger made while areal has swapped the logging tree is detached
# for good (cua_rl/logs.py); ``python -m cua_rl.sft`` printed no "SFT step" line for that reason.
keep_stdlib_logging()

from .demos import Demonstration, DemoTurn, qwen3_vl_reply, record_demo, record_demos
from .rows import demo_rows, demo_turn, reply_ids
from .train import SFTResult, train_rows

__all__ = ["Demonstration", "DemoTurn", "qwen3_vl_reply", "record_demo", "record_demos", "demo_rows", "demo_turn",
           "reply_ids", "SFTResult", "train_rows"]
