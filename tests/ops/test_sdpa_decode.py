"""A decoding step's query sees every key: attention_sdpa builds no mask for it."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gatedattn.ops import attention_reference, attention_sdpa
from gatedattn.ops.reference import causal_mask


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_decoding_step_runs_unmasked_and_matches_the_masked_kernel_exactly(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 8, generator=g).to(dtype)
    k, v = torch.randn(2, 2, 7, 8, generator=g).to(dtype), torch.randn(2, 2, 7, 8, generator=g).to(dtype)
    ops = Ops()
    with ops:
        out = attention_sdpa(q, k, v, q_offset=6, scale=0.3)
    assert not {"arange", "le", "where"} & set(ops.names)  # no mask built
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(1, 7, 6, q.device), scale=0.3,
                                            enable_gqa=True)
    assert torch.equal(out, masked)
    ref = attention_reference(q.float(), k.float(), v.float(), q_offset=6, scale=0.3)
    torch.testing.assert_close(out.float(), ref, **({} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)))


def test_queries_that_do_not_see_every_key_keep_the_causal_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 2, 4, generator=g), torch.randn(1, 2, 6, 4, generator=g), torch.randn(1, 2, 6, 4, generator=g)
    for tq, offset in ((2, 4), (1, 3)):  # two new queries; one query in the middle of the keys
        torch.testing.assert_close(attention_sdpa(q[:, :, :tq], k, v, q_offset=offset),
                                   attention_reference(q[:, :, :tq], k, v, q_offset=offset))


@pytest.mark.parametrize("key_mask", [False, True])
def test_grouped_query_attention_compiles_with_symbolic_head_counts(key_mask):
    """A process that compiles models of several head counts (dynamo then traces the sizes
    symbolically) still gets a bool for SDPA's ``enable_gqa``, and the same output."""
    import torch._dynamo as dynamo

    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.tensor([[True] * 5, [False, True, True, True, True]]) if key_mask else None
    kwargs = {"key_mask": mask} if key_mask else {}
    dynamo.reset()
    compiled = torch.compile(attention_sdpa, backend="eager", dynamic=True, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, **kwargs), attention_sdpa(q, k, v, **kwargs))
