"""KVCache with a capacity writes each step in place; RoPE tables shared by a forward's layers."""

import pytest
import torch

from gatedattn import GatedAttnError, KVCache
from gatedattn.layers.config import RopeConfig
from gatedattn.layers.rope import RopeTables, Rotary


def steps(lengths, *, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, 3, n, 4, generator=g, dtype=dtype).requires_grad_(requires_grad),
             torch.randn(2, 3, n, 5, generator=g, dtype=dtype).requires_grad_(requires_grad)) for n in lengths]


def test_a_cache_with_capacity_holds_what_concatenation_holds_written_in_place():
    grown, reserved = KVCache(), KVCache(capacity=6)
    first_ptr = None
    for k, v in steps([3, 1, 1, 1]):
        k0, v0 = grown.update(k, v)
        k1, v1 = reserved.update(k, v)
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
        first_ptr = first_ptr or k1.data_ptr()
        assert k1.data_ptr() == first_ptr  # one buffer, every step written into it
    assert reserved.length == 6 and reserved.batch_size == 2
    assert reserved.nbytes() == grown.nbytes() == 2 * 3 * 6 * (4 + 5) * 4
    # past the capacity the buffers grow, and still hold what concatenation holds
    for k, v in steps([2, 1]):
        assert torch.equal(grown.update(k, v)[0], reserved.update(k, v)[0])
    assert reserved.length == grown.length == 9
    # cropped, the next step is written over the forgotten positions
    grown.crop(4), reserved.crop(4)
    k, v = steps([1])[0]
    assert torch.equal(grown.update(k, v)[1], reserved.update(k, v)[1]) and reserved.length == 5


def test_latents_are_written_in_place_too_and_promoted_like_concatenation():
    grown, reserved = KVCache(), KVCache(capacity=4)
    g = torch.Generator().manual_seed(1)
    for n, dtype in ((2, torch.bfloat16), (1, torch.bfloat16), (1, torch.float32)):
        latent, k_rope = torch.randn(2, n, 6, generator=g).to(dtype), torch.randn(2, n, 1, 4, generator=g).to(dtype)
        a, b = grown.update_latent(latent, k_rope), reserved.update_latent(latent, k_rope)
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))
    assert reserved.latent.dtype == torch.float32 and reserved.length == 4


def test_steps_with_gradients_concatenate_so_autograd_keeps_what_it_saved():
    cache = KVCache(capacity=8)
    (k1, v1), (k2, v2) = steps([2, 1], requires_grad=True)
    a, _ = cache.update(k1, v1)
    b, _ = cache.update(k2, v2)
    (a.sum() + b.square().sum()).backward()  # nothing written over a saved tensor
    torch.testing.assert_close(k1.grad, 1 + 2 * k1.detach())
    torch.testing.assert_close(k2.grad, 2 * k2.detach())


@pytest.mark.parametrize("capacity", [0, -1, 2.0, True, "8"])
def test_a_bad_capacity_is_refused_naming_it(capacity):
    with pytest.raises(GatedAttnError, match="KVCache capacity"):
        KVCache(capacity)


def test_rope_tables_are_computed_once_for_layers_with_the_same_rope():
    cfg = RopeConfig()
    a, b, scaled = Rotary(cfg, 8), Rotary(cfg, 8), Rotary(RopeConfig(scaling="yarn", factor=4.0), 8)
    positions = torch.arange(5)[None]
    tables = RopeTables(positions)
    cos, sin = tables.cos_sin(a, positions, torch.float32)
    again = tables.cos_sin(b, positions, torch.float32)
    assert again[0] is cos and again[1] is sin  # computed once
    assert all(torch.equal(x, y) for x, y in zip(again, b.cos_sin(positions, torch.float32)))
    other = tables.cos_sin(scaled, positions, torch.float32)  # another RoPE: its own tables
    assert all(torch.equal(x, y) for x, y in zip(other, scaled.cos_sin(positions, torch.float32)))
    assert not torch.equal(other[0], cos)
    assert tables.cos_sin(a, positions, torch.bfloat16)[0].dtype == torch.bfloat16
    elsewhere = torch.arange(1, 6)[None]  # positions not the forward's: computed for them
    assert torch.equal(tables.cos_sin(a, elsewhere, torch.float32)[0], a.cos_sin(elsewhere, torch.float32)[0])
