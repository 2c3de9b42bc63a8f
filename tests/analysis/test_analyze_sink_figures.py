"""The per-layer / per-head sink figures of ``analyze``, each against a hand computation on a
tiny model: first-token attention per head, value drain, residual peak, the M-Act channels;
and the two plots drawn from them."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from gatedattn import GatedLM, ModelConfig
from gatedattn.analysis import analyze, first_position_norm_ratio, plots
from gatedattn.analysis.metrics import FirstPositionNorms, TopActivations
from gatedattn.analysis.probe import ProbeCore
from gatedattn.layers.config import RopeConfig

V = 50
NEW_KEYS = ("value_drain_per_layer", "value_drain_per_head", "residual_peak_per_layer", "m_act_channels",
            "first_token", "windows")


def micro(variant="baseline", **kw):
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, max_seq_len=16, **kw))


def perturbed(variant="baseline", seed=0, **kw):
    torch.manual_seed(seed)
    model = micro(variant, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def batch(B=3, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(1, V, (B, T + 1), generator=g)
    b[:, 0] = 0
    return b


def ratio(norms_BT):
    """||x_0|| / mean_{i>=1} ||x_i||, means over the batch: norms_BT (B, T) float64."""
    return (norms_BT[:, 0].mean() / norms_BT[:, 1:].mean()).item()


def by_hand(model, ids):
    """Per layer: the value states (B, T, Hkv, D) after v_proj and the block output (B, T, C),
    by running the blocks one at a time."""
    values, hidden = [], []
    with torch.no_grad():
        x = model.embed(ids)
        for block in model.blocks:
            attn = block.attn
            v = attn.qkv.v_proj(block.attn_norm(x))
            values.append(v.view(*v.shape[:2], attn.cfg.n_kv_heads, attn.cfg.head_dim).double())
            x = block(x)
            hidden.append(x.double())
    return values, hidden


def test_value_drain_and_residual_peak_equal_a_hand_computation():
    model = perturbed()
    b = batch()
    r = analyze(model, [b])
    values, hidden = by_hand(model, b[:, :-1])
    Hkv = model.cfg.attention.n_kv_heads
    assert len(r["value_drain_per_head"]) == model.cfg.n_layers
    for layer, (v, h) in enumerate(zip(values, hidden, strict=True)):
        norms = v.norm(dim=-1)  # (B, T, Hkv)
        per_head = [ratio(norms[:, :, g]) for g in range(Hkv)]
        pooled = (norms[:, 0, :].mean() / norms[:, 1:, :].mean()).item()
        assert r["value_drain_per_head"][layer] == pytest.approx(per_head, rel=1e-6)
        assert r["value_drain_per_layer"][layer] == pytest.approx(pooled, rel=1e-6)
        assert r["residual_peak_per_layer"][layer] == pytest.approx(ratio(h.norm(dim=-1)), rel=1e-6)
    assert len(r["value_drain_per_head"][0]) == Hkv == 2


def captured(model, ids, part: str) -> dict:
    """Per layer, what the ``ProbeCore``'s ``part`` module (``probs`` or ``values``) outputs
    for ``ids``, in float64; every layer's own core is back afterwards."""
    out = {}
    with contextlib.ExitStack() as stack, torch.no_grad():
        for i, blk in enumerate(model.blocks):
            core = stack.enter_context(blk.attn.with_core(ProbeCore()))
            hook = getattr(core, part).register_forward_hook(
                lambda m, inp, o, i=i: out.__setitem__(i, o.detach().double()))
            stack.callback(hook.remove)
        model(ids)
    return out


def test_f_attn_per_head_equals_a_hand_computation():
    model = perturbed("gated")
    b = batch()
    r = analyze(model, [b])
    probs = captured(model, b[:, :-1], "probs")
    for i in range(model.cfg.n_layers):
        p = probs[i]  # (B, H, T, T)
        want = [p[:, h, 1:, 0].mean().item() for h in range(p.shape[1])]
        assert r["f_attn_per_head"][i] == pytest.approx(want, abs=1e-9)
        assert r["f_attn_per_layer"][i] == pytest.approx(sum(want) / len(want), abs=1e-9)


def test_the_value_states_are_those_the_attention_mixes():
    """With a g2 gate (it scales v) the drain reads the gated values the core receives."""
    model = perturbed("g2-value")
    b = batch()
    r = analyze(model, [b])
    seen = captured(model, b[:, :-1], "values")
    ungated, _ = by_hand(model, b[:, :-1])
    for i in range(model.cfg.n_layers):
        norms = seen[i].norm(dim=-1)  # (B, Hkv, T)
        want = [ratio(norms[:, g]) for g in range(norms.shape[1])]
        assert r["value_drain_per_head"][i] == pytest.approx(want, rel=1e-6)
        plain = ungated[i].norm(dim=-1)
        assert r["value_drain_per_head"][i] != pytest.approx([ratio(plain[:, :, g]) for g in range(2)], rel=1e-3)


def test_m_act_channels_equal_a_brute_force_search():
    model = perturbed("hyga")
    b = batch(B=4)
    r = analyze(model, [b], n_top_channels=7)
    _, hidden = by_hand(model, b[:, :-1])
    entries = []
    for layer, h in enumerate(hidden):
        a = h.abs()
        flat = int(a.argmax())
        s, t, c = (int(x) for x in torch.unravel_index(torch.tensor(flat), a.shape))
        got = r["m_act_channels"]["per_layer"][layer]
        assert (got["layer"], got["sequence"], got["position"], got["channel"]) == (layer, s, t, c)
        assert got["value"] == pytest.approx(h[s, t, c].item(), rel=1e-6)
        assert r["m_act_location_per_layer"][layer] == [s, t, c]
        best, seq = a.max(dim=0)  # (T, C): each (position, channel) at its largest over sequences
        for t in range(best.shape[0]):
            for c in range(best.shape[1]):
                entries.append((best[t, c].item(), layer, t, c, int(seq[t, c])))
    entries.sort(key=lambda e: (-e[0], e[1], e[2], e[3]))
    top = r["m_act_channels"]["top"]
    assert [(e["layer"], e["position"], e["channel"], e["sequence"]) for e in top] == \
        [(layer, t, c, s) for _, layer, t, c, s in entries[:7]]
    assert [abs(e["value"]) for e in top] == pytest.approx([e[0] for e in entries[:7]], rel=1e-6)


def test_a_massive_value_planted_at_position_0_is_found():
    model = perturbed("gated")
    with torch.no_grad():
        model.embed.weight[0, 13] = -3.0e4  # BOS (id 0) carries it in channel 13
    r = analyze(model, [batch(), batch(seed=1)], n_top_channels=4)
    for layer, e in enumerate(r["m_act_channels"]["per_layer"]):
        assert (e["layer"], e["channel"], e["position"]) == (layer, 13, 0)
        assert e["value"] == pytest.approx(-3.0e4, rel=0.01)
    top = r["m_act_channels"]["top"]
    assert len(top) == 4  # each (layer, position, channel) once, at its largest over sequences:
    assert sorted((e["layer"], e["channel"], e["position"]) for e in top[:2]) == [(0, 13, 0), (1, 13, 0)]
    assert all(abs(e["value"]) < 1e3 and (e["channel"], e["position"]) != (13, 0) for e in top[2:])
    assert all(p > 100 for p in r["residual_peak_per_layer"])  # ||h_0|| dwarfs the others


def test_a_first_value_of_zero_is_a_full_drain():
    """BOS's embedding is channel 0 only and v_proj ignores channel 0: v_0 = 0 in every layer
    (o_proj and down_proj are zero, so the residual stream stays the embedding)."""
    model = micro(qk_norm=False, attention_fields={"rope": RopeConfig(fraction=0.0, original_max_len=16)})
    with torch.no_grad():
        model.embed.weight[:, 0] = 0.0
        model.embed.weight[0] = 0.0
        model.embed.weight[0, 0] = 1.0
        for block in model.blocks:
            block.attn.qkv.v_proj.weight[:, 0] = 0.0
            block.attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
    r = analyze(model, [batch()])
    assert r["value_drain_per_layer"] == [0.0, 0.0]
    assert r["value_drain_per_head"] == [[0.0, 0.0], [0.0, 0.0]]


def test_streaming_over_batches_equals_one_big_batch():
    model = perturbed("hyga-sink")
    batches = [batch(B=2, seed=s) for s in range(3)]
    split, whole = analyze(model, batches), analyze(model, [torch.cat(batches)])
    for key in ("value_drain_per_layer", "residual_peak_per_layer"):
        assert split[key] == pytest.approx(whole[key], rel=1e-9), key
    for key in ("value_drain_per_head", "f_attn_per_head"):
        for a, b in zip(split[key], whole[key], strict=True):
            assert a == pytest.approx(b, rel=1e-9), key
    assert split["m_act_channels"] == whole["m_act_channels"]


def test_mla_values_are_per_head_and_short_windows_give_none():
    model = perturbed("hyga", attention_fields={"kv": "mla"})
    r = analyze(model, [batch()])
    assert all(len(row) == model.cfg.attention.n_heads for row in r["value_drain_per_head"])
    one = analyze(micro(), [torch.zeros(2, 2, dtype=torch.long)])  # T = 1: no position i >= 1
    assert one["value_drain_per_layer"] == [None, None] and one["residual_peak_per_layer"] == [None, None]
    json.dumps(one, allow_nan=False)
    assert set(NEW_KEYS) <= set(one)


def test_first_position_norm_ratio_and_accumulators_on_known_values():
    x = torch.zeros(2, 1, 3, 2)
    x[0, 0] = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 1.0]])  # norms 5, 1, 1
    x[1, 0] = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 2.0]])  # norms 1, 2, 2
    assert first_position_norm_ratio(x).tolist() == [pytest.approx(3.0 / 1.5)]
    acc = FirstPositionNorms()
    acc.update(x[:1])
    acc.update(x[1:])
    assert acc.per_group().tolist() == [pytest.approx(2.0)] and acc.overall() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no data"):
        FirstPositionNorms().overall()
    with pytest.raises(ValueError, match=r"\(B, G, T, D\)"):
        first_position_norm_ratio(torch.zeros(3, 4))
    top = TopActivations(2)
    top.update(0, torch.tensor([[[1.0, -9.0], [2.0, 0.0]]]))
    top.update(1, torch.tensor([[[0.0, 0.0], [8.0, 0.0]]]))
    assert [(e["layer"], e["position"], e["channel"], e["value"]) for e in top.top()] == [(0, 0, 1, -9.0),
                                                                                           (1, 1, 0, 8.0)]


# --------------------------------------------------------------------------- plots


@pytest.mark.filterwarnings("error")
def test_first_token_map_and_sink_profile_plots(tmp_path, monkeypatch):
    figures, save = [], plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or save(fig, path))  # still written
    r = analyze(perturbed("gated"), [batch()])
    for fn, name in ((plots.plot_first_token_map, "map.png"), (plots.plot_sink_profile, "profile.png")):
        path = fn(r, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(path)[..., :3].std() > 0
    # the map is the per-head first-token attention (layers x heads); the profile draws each
    # per-layer figure against its no-sink level (uniform attention, ratio 1)
    (heat,) = [ax for ax in figures[0].axes if ax.images]
    assert heat.get_title() == "gated: attention on the first token per head"
    assert np.allclose(heat.images[0].get_array(), r["f_attn_per_head"])
    drawn = {ax.get_ylabel(): ax.lines for ax in figures[1].axes if ax.lines}
    assert [line.get_label() for line in drawn["F-Attn"]] == ["gated", "uniform"]
    for label, key in (("F-Attn", "f_attn_per_layer"), ("value drain |v0| / |vi|", "value_drain_per_layer"),
                       ("residual peak |h0| / |hi|", "residual_peak_per_layer")):
        assert np.allclose(drawn[label][0].get_ydata(), r[key])
    assert all(np.allclose(drawn[label][1].get_ydata(), 1.0) for label in list(drawn)[1:])
    # missing values (a JSON result's None) are drawn as gaps, not errors
    r["f_attn_per_head"][0][1] = None
    r["value_drain_per_layer"] = [None, None]
    r["residual_peak_per_layer"][1] = None
    r["seq_len"] = None
    plots.plot_first_token_map(r, tmp_path / "map2.png")
    plots.plot_sink_profile(r, tmp_path / "profile2.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png", "map2.png", "profile.png", "profile2.png"]
    with pytest.raises(ValueError, match="no f_attn_per_head"):
        plots.plot_first_token_map({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="no f_attn_per_layer"):
        plots.plot_sink_profile({"f_attn_per_layer": []}, tmp_path / "x.png")


def test_uniform_reference_of_the_profile():
    assert plots._uniform_f_attn(2) == 0.5
    assert plots._uniform_f_attn(4) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert plots._uniform_f_attn(None) is None and plots._uniform_f_attn(1) is None
    assert math.isclose(plots._uniform_f_attn(16), sum(1 / (i + 1) for i in range(1, 16)) / 15)
