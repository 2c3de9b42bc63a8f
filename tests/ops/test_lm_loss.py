"""The fused LM head + next-token loss (``ops.linear_cross_entropy``) against its reference,
forward and backward: float64 and float32, bf16 autocast, every reduction, ignored
targets, chunks that do not divide the rows, a frozen head; what it keeps for backward;
and its bad inputs."""

import pytest
import torch

from gatedattn.ops import linear_cross_entropy, lm_loss, reference
from test_fused_gate import saved_bytes  # tests/ops is on the path, as pytest runs it

N, C, V = 37, 16, 50


def _inputs(dtype=torch.float64, frozen_head=False, ignore=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, C, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(V, C, generator=g, dtype=dtype).requires_grad_(not frozen_head)
    t = torch.randint(0, V, (N,), generator=g)
    if ignore:
        t[::4] = -100
    return h, w, t


def _grads(loss, tensors):
    weight = torch.randn(loss.shape, generator=torch.Generator().manual_seed(9), dtype=loss.dtype) \
        if loss.dim() else torch.tensor(1.0, dtype=loss.dtype)
    return torch.autograd.grad((loss * weight).sum(), [t for t in tensors if t.requires_grad])


@pytest.fixture(params=["kept", "recomputed"])
def logits(request, monkeypatch):
    """Both backward paths of a trained head: the forward's logits kept, or recomputed (a
    budget of 0 bytes)."""
    if request.param == "recomputed":
        monkeypatch.setattr(lm_loss, "KEEP_LOGITS_BYTES", 0)
    return request.param


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 5, 37, 100])
@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("frozen_head", [False, True])  # a frozen head takes the one-pass path
def test_matches_the_reference_in_float64(reduction, chunk, ignore, frozen_head, logits):
    h, w, t = _inputs(ignore=ignore, frozen_head=frozen_head)
    fused = linear_cross_entropy(h, w, t, reduction=reduction, chunk=chunk)  # chunk: vocabulary entries
    plain = reference.linear_cross_entropy(h, w, t, reduction=reduction)
    assert fused.shape == plain.shape and fused.dtype == torch.float64
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    for a, b in zip(_grads(fused, (h, w)), _grads(plain, (h, w))):
        assert a.dtype == torch.float64 and torch.count_nonzero(b) > 0  # not a degenerate comparison
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if ignore and reduction == "none":
        assert torch.all(fused[::4] == 0)


def test_a_frozen_head_gets_no_gradient_and_the_input_the_reference_one():
    h, w, t = _inputs(frozen_head=True)
    (dh,) = _grads(linear_cross_entropy(h, w, t, chunk=8), (h, w))
    (ref,) = _grads(reference.linear_cross_entropy(h, w, t), (h, w))
    torch.testing.assert_close(dh, ref)


@pytest.mark.parametrize("frozen_head", [False, True])
def test_under_bf16_autocast_it_computes_what_the_unfused_path_does(frozen_head, logits):
    h, w, t = _inputs(dtype=torch.float32, frozen_head=frozen_head)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, t, chunk=6)
        plain = reference.linear_cross_entropy(h, w, t)
    torch.testing.assert_close(fused, plain, rtol=2e-3, atol=2e-3)
    fg, pg = _grads(fused, (h, w)), _grads(plain, (h, w))
    assert len(fg) == len(pg) == (1 if frozen_head else 2)
    for a, b in zip(fg, pg):
        assert a.dtype == torch.float32  # gradients in the parameters' dtype
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    # and both stay close to the float32 loss: bf16 products, float32 softmax
    torch.testing.assert_close(fused, reference.linear_cross_entropy(h, w, t), rtol=2e-2, atol=2e-2)


def _head(requires_grad=True):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(256, 32, generator=g, requires_grad=True)
    w = torch.randn(4096, 32, generator=g, requires_grad=requires_grad)
    return h, w, torch.randint(0, 4096, (256,), generator=g)


def test_keeps_no_logits_for_backward_beyond_the_budget(monkeypatch):
    h, w, t = _head()
    monkeypatch.setattr(lm_loss, "KEEP_LOGITS_BYTES", 256 * 4096 * 4 - 1)  # a byte short of the logits
    _, fused = saved_bytes(lambda: linear_cross_entropy(h, w, t))
    _, plain = saved_bytes(lambda: reference.linear_cross_entropy(h, w, t))
    logits_bytes = 256 * 4096 * 4
    assert plain >= logits_bytes and fused <= plain - logits_bytes + 16 * 256  # h, W and a few (N,) rows


@pytest.mark.parametrize("autocast", [False, True])
def test_within_the_budget_it_keeps_the_logits_once_in_the_products_dtype(monkeypatch, autocast):
    h, w, t = _head()
    monkeypatch.setattr(lm_loss, "KEEP_LOGITS_BYTES", 256 * 4096 * 4)  # float32 logits just fit
    size = 2 if autocast else 4  # the products' dtype: bf16 under autocast
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _, fused = saved_bytes(lambda: linear_cross_entropy(h, w, t))
    kept = fused - (h.numel() + w.numel()) * size  # beyond h and W: the logits and a few (N,) rows
    assert 256 * 4096 * size <= kept <= 256 * 4096 * size + 16 * 256


def test_a_frozen_head_keeps_only_the_inputs_gradient():
    h, w, t = _head(requires_grad=False)
    _, fused = saved_bytes(lambda: linear_cross_entropy(h, w, t))
    assert fused <= 256 * 32 * 4 + 16 * 256  # dL/dh (N, C) and a mask: neither h nor the head


def test_a_frozen_head_over_many_chunks_rescales_its_running_gradient():
    # logits that grow chunk by chunk: every chunk raises the running log-sum-exp, so a
    # missing rescale of the accumulated gradient would show
    g = torch.Generator().manual_seed(3)
    h = torch.randn(8, 4, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(60, 4, generator=g, dtype=torch.float64) * torch.linspace(0.1, 6, 60, dtype=torch.float64)[:, None]
    t = torch.randint(0, 60, (8,), generator=g)
    (dh,) = _grads(linear_cross_entropy(h, w, t, reduction="none", chunk=7), (h, w))
    (ref,) = _grads(reference.linear_cross_entropy(h, w, t, reduction="none"), (h, w))
    torch.testing.assert_close(dh, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("bad, match", [
    (dict(reduction="avg"), "reduction"),
    (dict(chunk=0), "chunk"),
    (dict(h=torch.zeros(3, 4, 5)), "h \\(N, C\\)"),
    (dict(t=torch.zeros(4, dtype=torch.long)), "targets"),
])
def test_bad_inputs_are_named(bad, match):
    h, w, t = _inputs()
    h, t = bad.pop("h", h), bad.pop("t", t)
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(h, w, t, **bad)
