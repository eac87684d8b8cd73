"""Make ``sdpa`` attention honour packed sequences (``cu_seq_lens_q``), for AReaL's trainer on the CPU.

Why: AReaL's FSDP engine packs every micro-batch into one row and passes ``cu_seq_lens_q/k``; on GPUs
flash-attention uses them. With ``attn_impl=sdpa`` (the only choice on a CPU) transformers ignores them,
and for Qwen-VL models (3-row M-RoPE position ids) it cannot detect the packing from position ids either,
so every packed sequence attends to the ones before it. Measured on the tiny model: the first row of a
micro-batch matches the inference server to 1e-6, the others differ by 0.17 nats (median). This
registers, through transformers' public ``AttentionInterface``, an ``sdpa`` that runs attention per
packed segment when ``cu_seq_lens_q`` is given, and is plain ``sdpa`` otherwise. Process-wide, opt-in:
call ``enable_packed_sdpa()`` in the trainer process before the actor is created (``cua_rl.areal_ext.worker``,
the RPC worker command of the configs, does).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)
_PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_enabled = False


def _segments(cu: torch.Tensor, total: int) -> list[tuple[int, int]]:
    bounds = [int(x) for x in cu.tolist()]
    segs = [(s, e) for s, e in zip(bounds[:-1], bounds[1:]) if e > s]
    if bounds[-1] < total:            # trailing padding: its own segment, never mixed with real tokens
        segs.append((bounds[-1], total))
    return segs


def packed_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                        is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    rest = {k: v for k, v in kwargs.items() if k not in _PACKING_KWARGS}
    packed = (cu_q is not None and attention_mask is None and query.shape[0] == 1
              and query.shape[2] == key.shape[2] and (cu_k is None or torch.equal(cu_q, cu_k))
              and len(cu_q) > 2)
    if not packed:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **rest)
    outs = [
        sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                               dropout=dropout, scaling=scaling, is_causal=is_causal, **rest)[0]
        for s, e in _segments(cu_q, query.shape[2])
    ]
    return torch.cat(outs, dim=1), None


def enable_packed_sdpa() -> None:
    """Register the packed-aware ``sdpa`` for this process (idempotent)."""
    global _enabled
    if _enabled:
        return
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", packed_sdpa_forward)
    _enabled = True
    logger.info("sdpa attention now honours cu_seq_lens_q (packed micro-batches on CPU)")
