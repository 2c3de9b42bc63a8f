"""Bad configs fail at construction with a message naming the field and allowed values."""

import json

import pytest

from gatedattn import VARIANTS, AttentionConfig, ConfigError, GateConfig, MLAConfig, RopeConfig, get_variant
from gatedattn.cli import main


@pytest.mark.parametrize("make,match", [
    (lambda: GateConfig(position="g7"), r"GateConfig\.position='g7'.*'g1', 'g2', 'g3', 'g4', 'g5'"),
    (lambda: GateConfig(granularity="channel"), r"GateConfig\.granularity.*'elementwise', 'headwise'"),
    (lambda: GateConfig(activation="relu"), r"GateConfig\.activation.*'sigmoid'"),
    (lambda: GateConfig(combine="concat"), r"GateConfig\.combine"),
    (lambda: GateConfig(fusion="max"), r"GateConfig\.fusion"),
    (lambda: GateConfig(h_dim=-1), r"GateConfig\.h_dim=-1 must be >= 0"),
    (lambda: GateConfig(rank=-4), r"GateConfig\.rank"),
    (lambda: GateConfig(source="static", rank=8), r"GateConfig\.rank=8 needs source='input'"),
    (lambda: GateConfig(position="g2", h_dim=8), r"h_dim / cross_head need position='g1'"),
    (lambda: GateConfig(position="g5", granularity="headwise"), r"position='g5'"),
    (lambda: GateConfig(source="none"), r"source='none' leaves no gate"),
    (lambda: GateConfig(shared=True, h_dim=4), r"shared=False"),
    (lambda: AttentionConfig(d_model=64, n_heads=6, n_kv_heads=4, head_dim=8), r"n_heads=6 must be divisible by n_kv_heads=4"),
    (lambda: AttentionConfig(d_model=60, n_heads=8), r"d_model=60 is not divisible by n_heads=8"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, kernel="flash"), r"AttentionConfig\.kernel='flash'.*'auto', 'sdpa', 'flash-lse', 'reference'"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, sink=True, kernel="sdpa"), r"sink=True.*kernel='sdpa'"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, sink_init=2.0), r"AttentionConfig\.sink_init=2 needs sink=True"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, sink=True, sink_init=float("inf")), r"sink_init=inf must be a finite"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, kv="latent"), r"AttentionConfig\.kv"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, n_kv_heads=2, kv="mla"), r"kv='mla' needs n_kv_heads == n_heads"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, kv="mla", qk_norm=True), r"qk_norm"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, mla=MLAConfig()), r"mla is set but kv='gqa'"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, head_transform="layernorm"), r"head_transform"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, n_kv_heads=0), r"n_kv_heads=0 must be > 0"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, gate="g1"), r"gate must be a GateConfig"),
    (lambda: AttentionConfig(d_model=64, n_heads=4, rope=RopeConfig(fraction=0.3)), r"rope\.fraction=0\.3 rotates 4\.8"),
    (lambda: RopeConfig(scaling="dynamic"), r"RopeConfig\.scaling.*'none', 'linear', 'ntk', 'yarn'"),
    (lambda: RopeConfig(factor=0.5), r"RopeConfig\.factor"),
    (lambda: MLAConfig(kv_rank=0), r"MLAConfig\.kv_rank=0"),
    (lambda: MLAConfig(rope_dim=5), r"MLAConfig\.rope_dim=5 must be even"),
    (lambda: get_variant("gated-typo"), r"unknown variant 'gated-typo'; known variants: baseline, gated"),
    (lambda: AttentionConfig.from_dict({"d_model": 8, "n_heads": 2, "heads": 3}), r"has no field 'heads'"),
])
def test_bad_config_raises_clear_error(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_config_round_trips_through_dict():
    for name, preset in VARIANTS.items():
        cfg = preset(64, 4, 2, kv="gqa")
        again = AttentionConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg, name
    mla = VARIANTS["hyga-sink"](64, 4, kv="mla")
    assert AttentionConfig.from_dict(mla.to_dict()) == mla


def test_defaults_are_derived():
    cfg = AttentionConfig(d_model=64, n_heads=4)
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.resolved_kernel) == (4, 16, "sdpa")
    assert cfg.replace(sink=True).resolved_kernel == "flash-lse"


def test_preset_table_covers_the_papers():
    required = {
        "baseline", "gated", "gated-headwise", "g2-value", "g3-key", "g4-query", "g5-dense", "g1-shared",
        "g1-silu", "g1-additive-silu", "g1-ns-sigmoid", "g1-static", "sdpa-rmsnorm", "sdpa-silu",
        "hyga", "hyga-lowrank", "hyga-mulfusion", "hyga-sink", "sink",
    }
    assert required <= set(VARIANTS)
    assert VARIANTS["hyga"](64, 4).gate.h_dim == 16  # d_int = head_dim
    low = VARIANTS["hyga-lowrank"](64, 4).gate
    assert (low.h_dim, low.rank, low.cross_head) == (16, 16, True)
    assert VARIANTS["hyga-mulfusion"](64, 4).gate.fusion == "multiply"
    assert VARIANTS["hyga-sink"](64, 4).sink and VARIANTS["sink"](64, 4).gate is None


def test_cli_reports_bad_shape_in_one_line(capsys):
    assert main(["variants", "--d-model", "96", "--n-heads", "6", "--n-kv-heads", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "n_heads=6 must be divisible by n_kv_heads=4" in err
