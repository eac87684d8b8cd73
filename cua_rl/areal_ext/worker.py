"""AReaL's RPC worker (``python -m areal.infra.rpc.rpc_server``) with this project's trainer-side patches.

Why: in AReaL's single-controller mode the actor (FSDP) and the rollout engine run in RPC worker
processes the scheduler starts from ``scheduling_spec[].cmd``; a patch applied in ``train.py`` (the
controller) never reaches them. The configs name this module as that command, so the patches are in place
before any model is built there:

- ``enable_packed_sdpa()``: AReaL packs each micro-batch into one row; without flash-attention (the CPU)
  stock sdpa lets a sequence attend to the ones packed before it (cua_rl/areal_ext/packed_attention.py).
  Harmless with flash_attention_2.
- ``compact_images.enable()``: training rows carry their ``pixel_values`` as palette codes, a quarter of the
  floats (cua_rl/trajectory/pixels.py); the FSDP engine decodes each micro-batch's just before its forward,
  bit-equal (cua_rl/areal_ext/compact_images.py). Rows with float pixels pass through.
- ``trainer_logprobs.enable()``: the gap between the trainer's recomputed logprobs and the engine's goes
  into every step's statistics (a health check reads it); with the Training Monitor on (``MONITOR_BASE_URL``
  and a token in the environment, set by ``train.py``), each turn's values are sent to it for the viewer.
- ``local_shards.enable()``: a batch shard this worker holds itself is read from its memory instead of
  being serialized to base64 JSON and fetched over its own HTTP server (cua_rl/areal_ext/local_shards.py);
  ``CUA_RL_AREAL_LOCAL_SHARDS=0`` leaves AReaL's fetch as it is.
- ``lora_vlm.enable()``: with ``actor.use_lora`` on a Qwen-VL actor (``CUA_RL_LORA``, set by ``train.py``),
  AReaL's FSDP engine asks PEFT's wrapper for the M-RoPE position ids where only the inner model has them
  (cua_rl/areal_ext/lora_vlm.py).
- ``entropy_bonus.enable()``: with ``entropy_bonus`` > 0 in the config (``CUA_RL_ENTROPY_BONUS``, set by
  ``train.py``), the actor's loss gets an entropy term (cua_rl/areal_ext/entropy_bonus.py).
- ``ports.enable()``: the ports this worker picks (for vLLM's server among others) come from the operating system's
  randomness, not from the run's seed, so two runs with one seed started together cannot pick the same ones
  (cua_rl/areal_ext/ports.py).
- ``share_vllm_cache()``, on the CPU stack only (``CUA_RL_SHARED_VLLM_CACHE`` in ``CPU_ENV``): AReaL gives
  every vLLM server a new cache directory (``VLLM_CACHE_ROOT``/<uuid>, so compile caches of servers on one
  GPU node cannot collide), which also empties vLLM's model-class cache: each start then inspects the model
  class in a subprocess that imports vLLM again, 9 s of one core on this machine. The CPU server compiles
  nothing (eager, TorchDynamo off), so it keeps vLLM's own default directory and reads the class from there.

Everything else (arguments, behaviour, exit code) is AReaL's worker unchanged.

Under AReaL's Ray scheduler (``scheduler.type=ray``) there is no command: every worker is AReaL's own Ray
actor. ``ray_setup`` applies the same patches there, as the job's ``worker_process_setup_hook``
(cua_rl/areal_ext/ray_cluster.py), in every worker process before its actor is built.
"""

from __future__ import annotations

import os
import runpy

from cua_rl.areal_ext import compact_images, entropy_bonus, local_shards, lora_vlm, ports, trainer_logprobs
from cua_rl.areal_ext.packed_attention import enable_packed_sdpa


def share_vllm_cache() -> None:
    """See the module docstring; AReaL appends a uuid to ``VLLM_CACHE_ROOT`` only when it is set."""
    if os.environ.get("CUA_RL_SHARED_VLLM_CACHE") == "1":
        os.environ.pop("VLLM_CACHE_ROOT", None)


def apply_patches(*, http_shards: bool = True) -> None:
    """The module docstring's patches, in this process; ``http_shards``: AReaL moves batch shards over its RPC
    workers' HTTP servers (not under Ray, whose object store carries them)."""
    share_vllm_cache()
    ports.enable()
    enable_packed_sdpa()
    compact_images.enable()
    trainer_logprobs.enable()
    entropy_bonus.enable()
    lora_vlm.enable()
    if http_shards and os.environ.get("CUA_RL_AREAL_LOCAL_SHARDS", "1") != "0":   # "0": AReaL's own fetch
        local_shards.enable()


def ray_setup() -> None:
    """Ray's ``worker_process_setup_hook``: the patches in a Ray worker process (see the module docstring)."""
    apply_patches(http_shards=False)


def main() -> None:
    apply_patches()
    runpy.run_module("areal.infra.rpc.rpc_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
