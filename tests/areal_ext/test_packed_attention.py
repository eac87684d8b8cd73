"""enable_packed_sdpa: a packed row with cu_seq_lens (AReaL's micro-batch layout) gives the same logits
as running each sequence alone; unpacked calls are untouched."""

from __future__ import annotations

import torch
from transformers import AutoModelForImageTextToText

from cua_rl.areal_ext.packed_attention import enable_packed_sdpa


def test_packed_rows_do_not_attend_to_each_other(tiny_model_dir):
    enable_packed_sdpa()
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    seqs = [torch.arange(5, 5 + n) for n in (7, 11, 4)]
    with torch.no_grad():
        alone = [model(input_ids=s[None]).logits[0] for s in seqs]
        ids = torch.cat(seqs)[None]
        pos = torch.cat([torch.arange(len(s)) for s in seqs]).view(1, 1, -1).expand(3, 1, -1)
        cu = torch.tensor([0, 7, 18, 22], dtype=torch.int32)
        packed = model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                       max_length_q=11, max_length_k=11).logits[0]
        plain = model(input_ids=ids, position_ids=pos).logits[0]   # no cu_seq_lens: ordinary causal sdpa
    got = torch.split(packed, [7, 11, 4])
    for a, b in zip(alone, got):
        assert torch.allclose(a, b, atol=1e-5)
    # without the segment information the later rows see the earlier ones (the bug being fixed)
    assert not torch.allclose(torch.split(plain, [7, 11, 4])[1], alone[1], atol=1e-3)
