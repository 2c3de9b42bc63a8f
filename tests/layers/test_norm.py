"""The fast RMSNorm against its reference (``F.rms_norm`` in float32), forward and backward."""

import pytest
import torch

from gatedattn.layers.norm import RMSNorm, rms_norm, rms_norm_reference
from op_counts import Ops


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = (torch.randn(shape[-1], generator=g) + 1).to(torch.promote_types(dtype, torch.float32))
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, None])
def test_forward_matches_reference(dtype, eps):
    x, w = _inputs((3, 7, 64), dtype)
    for weight in (w, None):
        out, ref = rms_norm(x, (64,), weight, eps), rms_norm_reference(x, (64,), weight, eps)
        assert out.dtype == ref.dtype == dtype
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-6  # bf16: one rounding step apart at most
        torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def test_multi_dim_normalized_shape():
    x, _ = _inputs((2, 5, 4, 16), torch.float32)
    w = torch.randn(4, 16)
    torch.testing.assert_close(rms_norm(x, (4, 16), w, 1e-6), rms_norm_reference(x, (4, 16), w, 1e-6))


def test_backward_matches_reference():
    x, w = _inputs((4, 9, 32), torch.float64)
    x[0, 0] = 0  # a zero row: the norm's own gradient there is a subgradient, the output's is rsqrt(eps) * w
    grads = []
    for fn in (rms_norm, rms_norm_reference):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xs, (32,), ws, 1e-5)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
        grads.append((xs.grad, ws.grad))
    (gx, gw), (rx, rw) = grads
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)
    assert torch.isfinite(gx).all()


def test_gradcheck():
    x, w = _inputs((2, 3, 8), torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, (8,), b, 1e-3),
                                    (x.requires_grad_(), w.requires_grad_()))


def test_module_runs_the_fast_path():
    norm = RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x, _ = _inputs((2, 16, 64), torch.float32)
    with Ops() as ops:
        out = norm(x)
    assert ops.count["linalg_vector_norm"] == 1
    assert not ops.count["mean"] and not ops.count["sum"]  # the reference's second reduction
    torch.testing.assert_close(out, rms_norm_reference(x, (64,), norm.weight, 1e-6))


def test_module_keeps_the_input_dtype_and_trains():
    norm = RMSNorm(16)
    x = torch.randn(3, 16, dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert norm.weight.grad is not None and x.grad is not None
