"""What this project asks of AReaL's vLLM server beyond AReaL's own ``vLLMConfig``.

``logprobs_mode``: vLLM 0.19.1 returns *raw* logprobs by default, computed before temperature. AReaL's
trainer recomputes logprobs at the sampling temperature (``actor.temperature``), so at any temperature
other than 1 the behaviour logprobs PPO uses would disagree with the trainer's by construction.
``processed_logprobs`` makes vLLM report the logprobs of the distribution it sampled from (after
temperature; with top_p < 1 or top_k > 0 that distribution is truncated, which AReaL's trainer does not
reproduce, so keep them at 1.0 / -1 for training). The gate in tests/policy/test_gates_trainer.py checks
agreement at temperature 1 and 0.7.

AReaL turns every field of the config into a server flag (``vLLMConfig.build_args`` uses ``asdict``), so
a field here is all it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal.api.cli_args import vLLMConfig


@dataclass
class CUAvLLMConfig(vLLMConfig):
    logprobs_mode: str = "processed_logprobs"
