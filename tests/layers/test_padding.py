"""Padded batches: padded keys get zero attention in every variant, the fast paths match
the reference forward and backward, and an unpadded batch runs exactly the unmasked code."""

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.ops import attention_flash_lse, attention_reference, attention_sdpa
from gatedattn.ops.reference import attention_probs_reference

V = 50
# every gate position and form, HyGA, sinks, GQA (micro: 4 heads, 2 KV heads) and MLA
VARIANTS = [("baseline", {}), ("gated", {}), ("gated-headwise", {}), ("g1-shared", {}), ("g1-silu", {}),
            ("g1-static", {}), ("g2-value", {}), ("g3-key", {}), ("g4-query", {}), ("g5-dense", {}),
            ("hyga", {}), ("hyga-lowrank", {}), ("hyga-mulfusion", {}), ("hyga-sink", {}), ("sink", {}),
            ("sdpa-rmsnorm", {}), ("gated", {"kv": "mla"}), ("sink", {"kv": "mla"}), ("g2-value", {"kv": "mla"})]
IDS = [v + ("-mla" if f else "") for v, f in VARIANTS]


def micro(variant="gated", **attention_fields):
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, attention_fields=attention_fields))


def left_pad(rows, pad=0):
    """Left-padded ids and mask of a list of 1-D token tensors."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):], mask[i, T - len(r):] = r, 1
    return ids, mask


# ----------------------------------------------------------------------------- kernels
KEY_MASK = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)


def _qkv(Hkv, D=8, Dv=8, T=7, B=3):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, 4, T, D, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, T, Dv, generator=g, requires_grad=True)
    return q, k, v


def test_reference_gives_padded_keys_zero_probability_sink_included():
    q, k, _ = _qkv(2)
    sink = torch.randn(4)
    for s in (None, sink):
        p = attention_probs_reference(q, k, s, key_mask=KEY_MASK)
        real_queries = KEY_MASK[:, None, :, None]
        padded_keys = ~KEY_MASK[:, None, None, :]
        assert (p.masked_select(real_queries & padded_keys) == 0).all()
        assert torch.isfinite(p).all()
    # with a sink, the real keys and the sink share the whole mass: the sink sees only real keys
    p = attention_probs_reference(q, k, sink, key_mask=KEY_MASK)
    unpadded = attention_probs_reference(q[:1, :, 3:], k[:1, :, 3:], sink)
    assert torch.allclose(p[:1, :, 3:, 3:], unpadded, atol=1e-6)


@pytest.mark.parametrize("Hkv,Dv", [(4, 8), (2, 8), (1, 8), (4, 12)])
@pytest.mark.parametrize("with_sink", [False, True])
def test_fast_kernels_match_reference_with_padding(Hkv, Dv, with_sink):
    fns = [attention_flash_lse] + ([] if with_sink else [attention_sdpa])
    sink = torch.randn(4, requires_grad=True) if with_sink else None
    if Dv != 8 and not with_sink:
        fns = [attention_flash_lse]
    inputs = [t for t in (*_qkv(Hkv, Dv=Dv), sink) if t is not None]

    def run(fn):
        q, k, v = inputs[:3]
        out = fn(q, k, v, sink, key_mask=KEY_MASK)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        # padding query rows' outputs are read by nothing: leave them out of the loss
        dout = dout * KEY_MASK[:, None, :, None]
        return out, torch.autograd.grad(out, inputs, dout)

    ref_out, ref_grads = run(attention_reference)
    for fn in fns:
        out, grads = run(fn)
        real = KEY_MASK[:, None, :, None].expand_as(out)
        assert torch.allclose(out[real], ref_out[real], atol=1e-5), fn.__name__
        for g, rg in zip(grads, ref_grads):
            assert torch.allclose(g, rg, atol=1e-5), fn.__name__


@pytest.mark.parametrize("fn", [attention_reference, attention_sdpa, attention_flash_lse])
def test_padded_keys_do_not_reach_real_queries(fn):
    """Garbage in the padded keys and values changes nothing at the real queries."""
    q, k, v = (t.detach() for t in _qkv(2))
    sink = torch.randn(4) if fn is not attention_sdpa else None
    out = fn(q, k, v, sink, key_mask=KEY_MASK)
    pad = ~KEY_MASK[:, None, :, None]
    k2, v2 = k.masked_fill(pad, 1e4), v.masked_fill(pad, -1e4)
    out2 = fn(q, k2, v2, sink, key_mask=KEY_MASK)
    real = KEY_MASK[:, None, :, None].expand_as(out)
    assert torch.isfinite(out2).all()
    assert torch.allclose(out[real], out2[real], atol=1e-6)


@pytest.mark.parametrize("fn", [attention_reference, attention_flash_lse])
def test_decoding_queries_after_a_padded_cache(fn):
    """Queries at an offset (decoding) see the padding of the cached prefix masked too."""
    q, k, v = (t.detach() for t in _qkv(2))
    sink = torch.randn(4)
    full = attention_reference(q, k, v, sink, key_mask=KEY_MASK)
    last = fn(q[:, :, -2:], k, v, sink, q_offset=5, key_mask=KEY_MASK)
    rows = KEY_MASK[:, -2:]
    assert torch.allclose(last[rows[:, None, :, None].expand_as(last)],
                          full[:, :, -2:][rows[:, None, :, None].expand_as(last)], atol=1e-6)


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("variant,fields", VARIANTS, ids=IDS)
def test_left_and_right_padded_rows_give_the_unpadded_logits(variant, fields):
    model = micro(variant, **fields)  # training mode: the fused training paths run
    rows = [torch.randint(0, V, (n,)) for n in (6, 3, 5)]
    ids, mask = left_pad(rows)
    out = model(ids, attention_mask=mask)
    right_ids, right_mask = ids.clone(), mask.clone()
    for i, r in enumerate(rows):
        right_ids[i], right_mask[i] = torch.roll(ids[i], len(r)), torch.roll(mask[i], len(r))
    right = model(right_ids, attention_mask=right_mask)
    with torch.no_grad():
        model.eval()  # and the plain inference paths
        out_eval = model(ids, attention_mask=mask)
    for i, r in enumerate(rows):
        alone = model(r[None])[0]
        assert torch.allclose(out[i, -len(r):], alone, atol=1e-5), i
        assert torch.allclose(out_eval[i, -len(r):], alone, atol=1e-5), i
        assert torch.allclose(right[i, :len(r)], alone, atol=1e-5), i


@pytest.mark.parametrize("variant,fields", [("hyga-sink", {}), ("gated", {}), ("sink", {"kv": "mla"})],
                         ids=["hyga-sink", "gated", "sink-mla"])
def test_fast_path_matches_reference_kernel_forward_and_backward_with_padding(variant, fields):
    fast = micro(variant, **fields)
    ref = micro(variant, kernel="reference", **fields)
    ref.load_state_dict(fast.state_dict())
    ids, mask = left_pad([torch.randint(0, V, (n,)) for n in (7, 4)])
    labels = ids.masked_fill(mask == 0, -100)
    for model in (fast, ref):
        logits = model(ids, attention_mask=mask)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        loss.backward()
    assert torch.allclose(fast(ids, attention_mask=mask), ref(ids, attention_mask=mask), atol=1e-5)
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


@pytest.mark.parametrize("variant,fields", [("gated", {}), ("hyga-sink", {}), ("gated", {"kv": "mla"})],
                         ids=["gated", "hyga-sink", "mla"])
def test_left_padded_batched_generation_equals_one_at_a_time(variant, fields):
    model = micro(variant, **fields).eval()
    rows = [torch.randint(1, V, (n,)) for n in (5, 2, 4)]
    ids, mask = left_pad(rows)
    batched = model.generate(ids, 6, temperature=0, attention_mask=mask)
    uncached = model.generate(ids, 6, temperature=0, attention_mask=mask, use_cache=False)
    assert torch.equal(batched, uncached)
    for i, r in enumerate(rows):
        alone = model.generate(r[None], 6, temperature=0)[0]
        assert torch.equal(batched[i, ids.shape[1] - len(r):], alone), i


def test_learned_positions_follow_the_mask():
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V, position_embedding="learned"))
    ids, mask = left_pad([torch.randint(0, V, (n,)) for n in (6, 2)])
    out = model(ids, attention_mask=mask)
    assert torch.allclose(out[1, -2:], model(ids[1:, -2:])[0], atol=1e-5)


def test_an_all_ones_mask_runs_exactly_the_unmasked_code():
    model = micro("hyga-sink")
    calls = []
    for block in model.blocks:
        core = block.attn.core
        fn = core.fn
        core.fn = lambda *a, _fn=fn, **kw: calls.append((_fn.__name__, sorted(kw))) or _fn(*a, **kw)
    ids = torch.randint(0, V, (2, 6))
    plain = model(ids)
    plain_calls, calls[:] = list(calls), []
    ones = model(ids, attention_mask=torch.ones_like(ids))
    assert calls == plain_calls and all("key_mask" not in kw for _, kw in calls)
    assert torch.equal(plain, ones)
    calls.clear()
    model(ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]))
    assert all("key_mask" in kw for _, kw in calls) and len(calls) == len(model.blocks)


def test_padded_decoding_step_by_step_matches_the_full_forward():
    model = micro("hyga-sink").eval()
    ids, mask = left_pad([torch.randint(0, V, (n,)) for n in (6, 3)])
    full = model(ids, attention_mask=mask)
    caches = model.new_cache()
    prefix = model(ids[:, :4], caches=caches, attention_mask=mask[:, :4])
    steps = [model(ids[:, t:t + 1], caches=caches, attention_mask=mask[:, :t + 1]) for t in range(4, 6)]
    got = torch.cat([prefix, *steps], dim=1)
    assert torch.allclose(got[mask.bool()], full[mask.bool()], atol=1e-5)


def test_padding_masks_that_are_refused():
    model = micro("gated")
    ids = torch.randint(0, V, (2, 4))
    with pytest.raises(GatedAttnError, match="2-D padding mask"):
        model(ids, attention_mask=torch.ones(2, 1, 4, 4))
    with pytest.raises(GatedAttnError, match=r"needs \(batch, past \+ new tokens\) = \(2, 4\)"):
        model(ids, attention_mask=torch.ones(2, 3))
    with pytest.raises(GatedAttnError, match="only 1 .token. and 0 .padding."):
        model(ids, attention_mask=torch.full((2, 4), 2))
    with pytest.raises(GatedAttnError, match="left padding"):
        model.generate(ids, 2, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))


def test_a_core_without_key_mask_refuses_padded_batches():
    from gatedattn.ops import attention_reference

    class PlainCore(torch.nn.Module):
        def forward(self, q, k, v, sink=None, *, q_offset=0, scale=None):
            return attention_reference(q, k, v, sink, q_offset=q_offset, scale=scale)

    model = micro("gated")
    ids = torch.randint(0, V, (2, 4))
    with model.blocks[0].attn.with_core(PlainCore()):
        model(ids, attention_mask=torch.ones_like(ids))  # unpadded: runs
        with pytest.raises(GatedAttnError, match="core PlainCore takes no key_mask"):
            model(ids, attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
