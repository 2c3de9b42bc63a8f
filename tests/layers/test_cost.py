"""cost(): exact parameter counts and the relative FLOPs of each gate."""

import json

import pytest

from gatedattn import VARIANTS, Attention, cost
from gatedattn.cli import main


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fields", [dict(n_kv_heads=4), dict(kv="mla")])
def test_params_equal_the_module(variant, fields):
    cfg = VARIANTS[variant](256, 8, **fields)
    c = cost(cfg, 128)
    layer = Attention(cfg)
    assert c.total_params == sum(p.numel() for p in layer.parameters())
    gate_params = sum(p.numel() for n, p in layer.named_parameters() if n.startswith(("gate.", "sink", "head_transform.")))
    assert c.params["gate"] == gate_params
    assert c.total_flops == sum(c.flops.values()) > 0
    assert (c.params["gate"] == 0) == (c.flops["gate"] == 0) or variant == "sdpa-silu"


def test_baseline_flops_by_hand():
    cfg = VARIANTS["baseline"](512, 8, 2)  # head_dim 64
    T = 256
    c = cost(cfg, T)
    proj = 2 * T * 512 * (512 + 2 * 128 + 512)
    assert c.flops["projections"] == proj
    pairs = T * (T + 1) // 2
    assert c.flops["attention"] == 8 * pairs * (2 * 64 * 2 + 3)
    assert c.flops["gate"] == 0 and c.params["gate"] == 0


def test_headwise_costs_about_one_over_d_of_elementwise():
    d = 128
    elem = cost(VARIANTS["gated"](2048, 16, 4, head_dim=d), 4096)
    head = cost(VARIANTS["gated-headwise"](2048, 16, 4, head_dim=d), 4096)
    assert head.params["gate"] * d == elem.params["gate"]
    ratio = head.flops["gate"] / elem.flops["gate"]
    assert 1 / d <= ratio < 1.1 / d + 0.01


@pytest.mark.parametrize("d_model,heads,head_dim,limit", [(2048, 16, 128, 0.25), (1024, 16, 64, 0.33)])
def test_hyga_lowrank_costs_a_fraction_of_gated(d_model, heads, head_dim, limit):
    """Low-rank X-gate (d_int = 16): gate cost ~ d_int / head_dim of the full G1 gate."""
    full = cost(VARIANTS["gated"](d_model, heads, 4, head_dim=head_dim), 4096)
    low = cost(VARIANTS["hyga-lowrank"](d_model, heads, 4, head_dim=head_dim), 4096)
    assert low.flops["gate"] / full.flops["gate"] <= limit
    assert low.params["gate"] / full.params["gate"] <= limit
    assert low.params["gate"] / full.params["gate"] >= 16 / head_dim  # the low-rank down projection alone


def test_variants_json_lists_every_preset(capsys):
    assert main(["variants", "--d-model", "256", "--n-heads", "8", "--n-kv-heads", "2", "--seq-len", "512", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(VARIANTS)
    for r in rows:
        for key in ("name", "params", "gate_params", "flops", "gate_flops"):
            assert key in r
        assert r["flops"] >= r["gate_flops"] >= 0
    by = {r["name"]: r for r in rows}
    assert by["baseline"]["gate_params"] == 0 and by["gated"]["gate_params"] == 256 * 256


def test_variants_table_prints(capsys):
    assert main(["variants", "--d-model", "256", "--n-heads", "8", "--kv", "mla"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in VARIANTS)
