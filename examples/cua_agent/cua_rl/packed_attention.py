"""PyTorch SDPA that respects AReaL's packed micro-batches (for CPU training), installed as ``sdpa``.

Why: AReaL's FSDP engine packs the sequences of a micro-batch into one row and passes their boundaries as
``cu_seq_lens_q``/``cu_seq_lens_k`` (flash-attention's varlen arguments). The stock ``sdpa`` ignores them,
so on a machine without flash-attention every sequence after the first attends to the ones packed before
it: measured on the tiny Qwen3-VL, trainer logprobs then differ from the inference logprobs by a median of
~0.3 nats for all but the first row of a micro-batch (exactly equal with this function). With a GPU and
``attn_impl: flash_attention_2`` none of this applies.

Use: ``import cua_rl.packed_attention`` before the model is built (train.py does); it replaces the ``sdpa``
entry of transformers' attention registry in this process (AReaL only accepts its known ``attn_impl``
names). Calls without ``cu_seq_lens_q`` (inference, the vision tower's per-image chunks) are passed to the
stock function unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "sdpa"


def packed_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                        is_causal=None, **kwargs):
    cu = kwargs.get("cu_seq_lens_q")
    length = query.shape[-2]
    if cu is not None and query.shape[0] == 1 and len(cu) > 2 and int(cu[-1]) == length \
            and key.shape[-2] == length:
        cu = cu.to(query.device)
        seq = torch.repeat_interleave(torch.arange(len(cu) - 1, device=query.device), cu[1:] - cu[:-1])
        mask = seq[:, None] == seq[None, :]
        if is_causal if is_causal is not None else getattr(module, "is_causal", True):
            mask = mask & torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
        return sdpa_attention_forward(module, query, key, value, mask[None, None], dropout, scaling,
                                      is_causal=False, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                  **kwargs)


AttentionInterface.register(NAME, packed_sdpa_forward)
