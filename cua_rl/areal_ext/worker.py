"""AReaL's RPC worker (``python -m areal.infra.rpc.rpc_server``) with this project's trainer-side patches.

Why: in AReaL's single-controller mode the actor (FSDP) and the rollout engine run in RPC worker
processes the scheduler starts from ``scheduling_spec[].cmd``; a patch applied in ``train.py`` (the
controller) never reaches them. The configs name this module as that command, so the patches are in place
before any model is built there:

- ``enable_packed_sdpa()``: AReaL packs each micro-batch into one row; without flash-attention (the CPU)
  stock sdpa lets a sequence attend to the ones packed before it (cua_rl/areal_ext/packed_attention.py).
  Harmless with flash_attention_2.
- ``trainer_logprobs.enable()``: with the Training Monitor on (``MONITOR_BASE_URL`` and a token in the
  environment, set by ``train.py``), each turn's recomputed logprobs are sent to it for the viewer.

Everything else (arguments, behaviour, exit code) is AReaL's worker unchanged.
"""

from __future__ import annotations

import runpy

from cua_rl.areal_ext import trainer_logprobs
from cua_rl.areal_ext.packed_attention import enable_packed_sdpa


def main() -> None:
    enable_packed_sdpa()
    trainer_logprobs.enable()
    runpy.run_module("areal.infra.rpc.rpc_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
