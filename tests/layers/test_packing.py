"""layers.packing: projections of one input run as one product only where their weights
already lie stacked in one tensor, with the same outputs; everywhere else each module is
called. models.casts.FrozenCasts lays the casts out that way."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gatedattn import GatedLM, ModelConfig
from gatedattn.layers import packing
from gatedattn.layers.packing import apply_linear, linear, packed_linear, stack_rows, stacked_weight
from gatedattn.models.casts import FrozenCasts
from op_counts import Ops


def _linears(*rows, bias=False, width=12):
    torch.manual_seed(0)
    return [nn.Linear(width, n, bias=bias) for n in rows]


def _stack(modules, dtype=torch.float64):
    """Give the modules weights that are row blocks of one tensor (as FrozenCasts does)."""
    for m, w in zip(modules, stack_rows([m.weight for m in modules], dtype)):
        m._parameters["weight"] = w
    for m in modules:
        if m.bias is not None:
            m._parameters["bias"] = m.bias.detach().to(dtype)
    return modules


@pytest.mark.parametrize("bias", [False, True])
def test_stacked_weights_give_one_product_with_each_modules_output(bias):
    modules = _stack(_linears(5, 3, 4, bias=bias))
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    weight, b = stacked_weight(modules)
    assert weight.shape == (12, 12) and weight.data_ptr() == modules[0].weight.data_ptr()  # a view, no copy
    assert torch.equal(weight, torch.cat([m.weight for m in modules]))
    outs = packed_linear(x, modules)
    for m, out in zip(modules, outs):
        torch.testing.assert_close(out, F.linear(x, m.weight, m.bias), rtol=1e-12, atol=1e-12)
    assert (b is None) == (not bias)


def test_separate_or_reordered_or_mixed_weights_are_called_one_by_one():
    separate = _linears(5, 3)
    assert stacked_weight(separate) is None and packed_linear(torch.randn(1, 12), separate) is None
    a, b = _stack(_linears(5, 3))
    assert stacked_weight([b, a]) is None  # stacked in the other order
    assert stacked_weight([a]) is None
    mixed = _stack(_linears(5, 3, bias=True))
    mixed[1].bias = None
    assert stacked_weight(mixed) is None  # a bias on one only


def test_a_hook_an_adapter_or_a_gradient_keeps_the_modules_calls():
    modules = _stack(_linears(5, 3), dtype=torch.float32)
    handle = modules[1].register_forward_hook(lambda *a: None)
    assert stacked_weight(modules) is None  # the hook must see its module's output
    handle.remove()
    assert stacked_weight(modules) is not None

    class Wrapped(nn.Linear):  # e.g. an adapter's subclass: its forward must run
        pass
    wrapped = Wrapped(12, 3)
    wrapped._parameters["weight"] = modules[1].weight
    assert stacked_weight([modules[0], wrapped]) is None

    trained = _linears(5, 3)
    buffer = torch.cat([m.weight.detach() for m in trained]).requires_grad_()
    for m, w in zip(trained, buffer.split([5, 3])):
        m._parameters["weight"] = w
    assert stacked_weight(trained) is None  # gradients asked of them: their own graph
    with torch.no_grad():
        assert stacked_weight(trained) is not None


def _micro(variant="baseline"):
    torch.manual_seed(0)
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=61, qk_norm=False)).eval()


def test_frozen_casts_run_q_k_v_and_gate_up_as_one_product_each():
    model = _micro()
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        own, run = Ops(), Ops()
        with own:
            ref = model(ids)
        with run:
            out = FrozenCasts(model)(ids)
    n = model.cfg.n_layers
    assert own.count["mm"] == 7 * n + 1  # q, k, v, o, gate, up, down; the head
    assert run.count["mm"] == 4 * n + 1  # [q|k|v], o, [gate|up], down; the head
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=0.05 * ref.float().abs().max().item())


def test_a_gated_layer_keeps_its_query_and_gate_product():
    # the X-gate is computed in the query projection's product ([q | gate]); k and v then
    # run on their own, though their casts are stacked
    model = _micro("gated")
    with torch.no_grad():
        casts = FrozenCasts(model).casts(torch.bfloat16)
    q = casts["blocks.0.attn.qkv.q_proj.weight"]
    k = casts["blocks.0.attn.qkv.k_proj.weight"]
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ops = Ops()
        with ops:
            FrozenCasts(model)(ids)
    assert ops.count["mm"] == 6 * model.cfg.n_layers + 1  # [q|gate], k, v, o, [gate|up], down; the head


class _Products(torch.utils._python_dispatch.TorchDispatchMode):
    """The shapes of the first two operands of every mm / addmm (the weight first: W @ x^T)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm"):
            a, b = args[:2] if name == "mm" else args[1:3]
            self.calls.append((name, tuple(a.shape), tuple(b.shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [2, 4, 37, packing.FEW_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_few_bf16_rows_run_as_weight_times_input(rows, bias):
    torch.manual_seed(rows)
    w = torch.randn(48, 16, dtype=torch.bfloat16)
    b = torch.randn(48, dtype=torch.bfloat16) if bias else None
    x = torch.randn(rows, 1, 16, dtype=torch.bfloat16)
    with _Products() as seen:
        out = linear(x, w, b)
    assert seen.calls == [("addmm" if bias else "mm", (48, 16), (16, rows))]  # the weight as it lies
    assert out.shape == (rows, 1, 48) and out.is_contiguous() and out.dtype == torch.bfloat16
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)  # one bf16 rounding


def test_few_rows_under_autocast_take_fp32_inputs():
    w = torch.randn(48, 16).to(torch.bfloat16)  # a FrozenCasts cast
    x = torch.randn(4, 16)  # the norm's float32 output
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        with _Products() as seen:
            out = linear(x, w)
        ref = F.linear(x, w)  # autocast's own product of the same bf16 operands
    assert seen.calls == [("mm", (48, 16), (16, 4))] and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=5e-2)  # a bf16 rounding apart at most


@pytest.mark.parametrize("case", ["one row", "many rows", "float32", "grad"])
def test_other_products_are_f_linear(case):
    rows = {"one row": 1, "many rows": packing.FEW_ROWS + 1}.get(case, 4)
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    w = torch.randn(48, 16, dtype=dtype, requires_grad=case == "grad")
    x = torch.randn(rows, 16, dtype=dtype)
    with _Products() as seen:
        out = linear(x, w)
    assert all(shape_x == (rows, 16) for _, shape_x, _ in seen.calls)  # x @ W^T: the input first
    assert torch.equal(out, F.linear(x, w))
    if case == "grad":
        out.float().sum().backward()
        assert w.grad is not None


def test_apply_linear_calls_a_hooked_or_wrapped_module():
    m = nn.Linear(16, 8).to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.allclose(apply_linear(m, x).float(), m(x).float(), atol=2e-2)
        fired = []
        m.register_forward_hook(lambda *a: fired.append(1))
        apply_linear(m, x)
    assert fired == [1]
