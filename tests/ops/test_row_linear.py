"""``ops.row_linear``: one- and two-row products as a multiply and a sum, against
``F.linear``; ``RowProducts`` routes exactly the products it serves."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gatedattn.ops import row_linear as R


@pytest.mark.parametrize("shape", [(1, 48), (2, 48), (1, 1, 48), (2, 1, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_is_f_linear_in_fp32(shape, bias):
    x, w = torch.randn(shape), torch.randn(80, 48)
    b = torch.randn(80) if bias else None
    out = R.row_linear(x, w, b)
    assert out.shape == (*shape[:-1], 80) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_row_linear_under_autocast_runs_in_its_dtype_like_f_linear():
    x, w, b = torch.randn(1, 1, 48), torch.randn(80, 48), torch.randn(80)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = R.row_linear(x, w, b), F.linear(x, w, b)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_it_takes_one_or_two_rows_without_gradients_only():
    w = torch.randn(8, 4)
    assert R.takes(torch.randn(1, 4), w, None) and R.takes(torch.randn(2, 1, 4), w, None)
    assert not R.takes(torch.randn(3, 4), w, None)  # from here the product reads the weight faster
    assert not R.takes(torch.randn(1, 4), w.requires_grad_(), None)  # training: autograd's product
    with torch.no_grad():
        assert R.takes(torch.randn(1, 4), w, None)


def test_row_products_route_the_products_they_serve(monkeypatch):
    routed, plain = [], R.row_linear

    def counting(x, weight, bias=None):
        routed.append(x.shape)
        return plain(x, weight, bias)

    monkeypatch.setattr(R, "row_linear", counting)
    layer = nn.Linear(48, 80)
    one, three = torch.randn(1, 1, 48), torch.randn(3, 48)
    with torch.no_grad(), R.RowProducts():
        out_one, out_three = layer(one), layer(three)
    assert routed == [one.shape]  # nn.Linear's F.linear, one row; three rows as they were
    with torch.no_grad():
        torch.testing.assert_close(out_one, layer(one), rtol=1e-5, atol=1e-5)
        assert torch.equal(out_three, layer(three))


@pytest.mark.slow
def test_compiled_row_products_equal_f_linear():
    """Inductor's loop for the multiply and the sum (the form is for compiled graphs)."""
    import torch._dynamo as dynamo

    dynamo.reset()
    layer = nn.Linear(48, 80)

    def f(x):
        with R.RowProducts():
            return layer(x)

    x = torch.randn(1, 1, 48)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), layer(x), rtol=1e-5, atol=1e-5)
