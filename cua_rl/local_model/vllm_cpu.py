"""vLLM on the CPU behind AReaL: the one worker-side fix that in-place weight updates need there.

Why: AReaL updates a running vLLM from disk through ``/areal_update_weights``, which makes every vLLM
worker call ``VLLMWorkerExtension.areal_update_weights``: vLLM's model loader writes the new checkpoint into
the live parameters. On the CPU, vLLM 0.19.1 repacks every linear layer's weight for oneDNN after loading
and then *replaces* ``layer.weight`` by an empty tensor (``dispatch_cpu_unquantized_gemm(remove_weight=
True)``); the language-model head keeps its tensor but computes from the packed copy. An in-place reload
then fails ("Attempted to load weight (torch.Size([128, 256])) into parameter (torch.Size([0]))"), or,
for the head, would load into a tensor nobody reads.

``CPUWorkerExtension`` is AReaL's extension plus this: when the worker imports it (vLLM resolves
``--worker-extension-cls`` before it loads the model), linear layers on the CPU compute straight from
their live ``weight`` with ``torch.nn.functional.linear``. Reloads then take effect at once, through
AReaL's own route and loader. The price is oneDNN's packed kernels, which matter for real models on a
CPU, not for the tiny one. On a GPU the patched function is never called, so the class is harmless there.

Select it with ``vllm.worker_extension_cls: cua_rl.local_model.vllm_cpu.CPUWorkerExtension``
(config.cpu.yaml does).
"""

from __future__ import annotations

import torch
from areal.engine.vllm_ext.vllm_worker_extension import VLLMWorkerExtension


def _live_weight_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    """Replacement for vLLM's CPU gemm dispatch: keep ``layer.weight`` and read it on every call."""
    del remove_weight  # the weight must stay: the next weight update loads into it
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def _patch_cpu_gemm() -> None:
    from vllm.model_executor.layers import utils

    utils.dispatch_cpu_unquantized_gemm = _live_weight_linear  # linear.py imports it at call time


_patch_cpu_gemm()


class CPUWorkerExtension(VLLMWorkerExtension):
    """AReaL's vLLM worker extension; importing this module made CPU linear layers reloadable.

    Each disk update also says in the server's log which checkpoint the worker loaded (AReaL's own line is
    below vLLM's log level): the run's rollout.log then shows that every update reached the model."""

    def areal_update_weights(self, model_path):
        ok, message = super().areal_update_weights(model_path)
        print(f"[cua-rl] vLLM worker {'loaded' if ok else 'FAILED to load'} weights from {model_path}",
              flush=True)
        return ok, message
