"""bench.products: a workload's matrix products recorded with their operands and replayed
alone; the real-model bench's goal verdicts."""

import pytest
import torch
from torch import nn

from gatedattn.bench.products import products_alone, record_products
from gatedattn.bench.real_model import FLOOR_GOAL, SPEEDUP_GOAL, goal


def test_every_product_of_a_workload_is_recorded_with_its_flops():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False))
    x = torch.randn(5, 8)
    b = torch.randn(3, 5, 8)

    def work():
        y = net(x)
        return y, torch.bmm(b, b.transpose(1, 2)), torch.softmax(y, -1)

    calls = record_products(work)
    assert [c[0].overloadpacket.__name__ for c in calls] == ["addmm", "mm", "bmm"]
    res = products_alone(work, repeats=2)
    assert res["products"] == 3 and res["seconds"] > 0
    assert res["flops"] == 2 * 5 * 8 * 16 + 2 * 5 * 16 * 4 + 2 * 3 * 5 * 8 * 5
    func, args, kwargs = calls[1]  # the operands are the workload's own (the same layout)
    assert torch.equal(func(*args, **kwargs), net[1](net[0](x)) @ net[2].weight.t())


def test_a_training_steps_backward_products_are_recorded_too():
    torch.manual_seed(0)
    lin = nn.Linear(8, 6, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    calls = record_products(lambda: lin(x).sum().backward())
    assert len(calls) == 3  # forward, and the input's and the weight's gradients


def test_repeats_must_be_a_positive_int():
    with pytest.raises(ValueError, match="repeats"):
        products_alone(lambda: None, repeats=0)


def test_the_goal_of_a_row():
    assert goal(SPEEDUP_GOAL, 3.0, 2.0) == "met"
    assert goal(1.0, 3.0, 1.05) == "missed"  # room was left: free work would have reached the goal
    assert goal(1.0, SPEEDUP_GOAL - 0.01, FLOOR_GOAL) == "at the floor"
    assert goal(1.0, SPEEDUP_GOAL - 0.01, FLOOR_GOAL + 0.01) == "near the floor"


def test_the_mfu_goal_is_set_on_bf16_training_only():
    from gatedattn.bench.real_model import MFU_GOAL, mfu_goal

    rows = [{"kind": "train", "ours_mfu": MFU_GOAL}, {"kind": "train-compiled", "ours_mfu": MFU_GOAL - 0.001},
            {"kind": "forward", "ours_mfu": 0.9}]
    assert mfu_goal(rows, "bf16") == {"train": {"mfu": MFU_GOAL, "goal": "met"},
                                              "train-compiled": {"mfu": MFU_GOAL - 0.001, "goal": "missed"}}
    assert mfu_goal(rows, "fp32") is None
