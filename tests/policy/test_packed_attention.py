"""``cua_rl.packed_attention``: packed SDPA equals attention run on each sequence alone (pure torch)."""

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from cua_rl.packed_attention import packed_sdpa_forward


class _Causal(torch.nn.Module):
    is_causal = True


def test_packed_rows_do_not_attend_across_boundaries():
    torch.manual_seed(0)
    lens = [5, 3, 4]
    q, k, v = (torch.randn(1, 2, sum(lens), 8) for _ in range(3))
    cu = torch.tensor([0, 5, 8, 12], dtype=torch.int32)
    packed, _ = packed_sdpa_forward(_Causal(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    alone = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        out, _ = sdpa_attention_forward(_Causal(), q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], None)
        alone.append(out)
    assert torch.allclose(packed, torch.cat(alone, dim=1), atol=1e-6)
    stock, _ = sdpa_attention_forward(_Causal(), q, k, v, None)  # what the stock sdpa computes
    assert not torch.allclose(stock[:, 5:], packed[:, 5:], atol=1e-3)
    assert torch.allclose(stock[:, :5], packed[:, :5], atol=1e-6)


def test_without_boundaries_it_is_the_stock_function():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    a, _ = packed_sdpa_forward(_Causal(), q, k, v, None)
    b, _ = sdpa_attention_forward(_Causal(), q, k, v, None)
    assert torch.equal(a, b)
