"""What this project asks of AReaL's vLLM server beyond AReaL's own ``vLLMConfig``.

``logprobs_mode``: vLLM 0.19.1 returns *raw* logprobs by default, computed before temperature. AReaL's
trainer recomputes logprobs at the sampling temperature (``actor.temperature``), so at any temperature
other than 1 the behaviour logprobs PPO uses would disagree with the trainer's by construction.
``processed_logprobs`` makes vLLM report the logprobs of the distribution it sampled from (after
temperature; with top_p < 1 or top_k > 0 that distribution is truncated, which AReaL's trainer does not
reproduce, so keep them at 1.0 / -1 for training). The gate in tests/policy/test_gates_trainer.py checks
agreement at temperature 1 and 0.7.

``mm_processor_cache_gb`` 0: no multimodal processor cache. vLLM 0.19.1 keeps two copies of it, one in its
API front end (which drops an image it believes the engine holds) and one in the engine; when they disagree
the engine fails every later request with "Expected a cached item for mm_hash" and stops answering (upstream
vllm#31404, #43941). It happened in a CI run of the multi-turn recipe at step 10 (every screenshot of an
episode is re-sent each turn, and AReaL aborts requests at every weight update): all requests failed, then
AReaL's pause before the next update waited forever. Without the cache each request's images are processed
again in the front end; the engine's own encoder cache is not affected.

AReaL turns every field of the config into a server flag (``vLLMConfig.build_args`` uses ``asdict``), so
a field here is all it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal.api.cli_args import vLLMConfig


@dataclass
class CUAvLLMConfig(vLLMConfig):
    logprobs_mode: str = field(default="processed_logprobs", metadata={
        "help": "Which logprobs vLLM returns: processed_logprobs, after temperature, as the trainer recomputes them."})
    mm_processor_cache_gb: float = field(default=0.0, metadata={
        "help": "vLLM's multimodal processor cache in GiB; 0 turns it off (its two copies disagreed: module doc)."})
