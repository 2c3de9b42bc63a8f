"""Checkpoint analysis: analyze() metrics, probe hygiene, extrapolate(), and the CLI."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

import gatedattn.cli
from gatedattn.analysis.analyze import (
    analyze,
    extrapolate,
    extrapolation_curves,
    format_analysis,
    format_extrapolation,
    load_any,
)
from gatedattn.analysis.metrics import first_token_attention, massive_activation, sink_fraction, sink_scores
from gatedattn.analysis.probe import Probe, hooked
from gatedattn.analysis.result import AnalysisResult
from gatedattn.layers.config import RopeConfig
from gatedattn.analysis.probe import ProbeCore
from gatedattn.analysis.windows import document_windows, val_documents
from gatedattn.data import TokenData, prepare
from gatedattn.infra.errors import GatedAttnError
from gatedattn.models.lm import GatedLM, ModelConfig

V = 97
REQUIRED_KEYS = {
    "variant", "n_layers", "n_heads", "seq_len", "n_sequences", "n_tokens", "val_loss", "val_ppl",
    "f_attn", "f_attn_per_layer", "f_attn_per_head", "eps", "sink_eps", "sink_eps_per_layer", "sink_alpha",
    "sink_mass", "sink_mass_per_layer", "m_act", "m_act_layer", "m_act_per_layer", "m_act_ratio",
    "m_act_ratio_per_layer", "m_act_ratio_max", "m_act_median_per_layer", "m_act_location_per_layer",
    "gate_mean", "gate_frac_below_0.01", "gate_frac_below_0.001", "gate_count", "gate_per_layer",
    "gate_mean_per_layer", "gate_per_score", "gate_histogram", "attention_maps",
}
GATE_KEYS = ("gate_mean", "gate_frac_below_0.01", "gate_frac_below_0.001", "gate_count", "gate_per_layer",
             "gate_mean_per_layer", "gate_per_score", "gate_histogram")


def micro(variant="gated", vocab_size=V, **kw):
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=vocab_size, max_seq_len=16, **kw))


def perturb(model, scale=0.3):
    """Move weights away from init so that layers, heads and gates differ."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def token_batches(n=2, B=2, T=16, low=1):
    """Batches (B, T+1) starting with BOS id 0, other ids in [low, V)."""
    out = []
    for _ in range(n):
        b = torch.randint(low, V, (B, T + 1))
        b[:, 0] = 0
        out.append(b)
    return out


def all_hooks(model):
    return [(name, kind) for name, m in model.named_modules()
            for kind in ("_forward_hooks", "_forward_pre_hooks") if getattr(m, kind)]


def collect_probs(model, ids):
    """Attention probabilities of every layer for ``ids``, by a manual ProbeCore swap."""
    probs, saved, handles = {}, [], []
    for i, block in enumerate(model.blocks):
        saved.append(block.attn.core)
        block.attn.core = ProbeCore()
        handles.append(block.attn.core.probs.register_forward_hook(
            lambda m, inp, out, i=i: probs.__setitem__(i, out.detach().clone())))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
        for block, core in zip(model.blocks, saved):
            block.attn.core = core
    return [probs[i] for i in range(len(model.blocks))]


def assert_finite_json(result):
    text = json.dumps(result, allow_nan=False)  # strict JSON: no NaN / inf anywhere
    assert json.loads(text) == result


# --------------------------------------------------------------------------- analyze


@pytest.mark.parametrize("variant", ["baseline", "gated", "hyga", "hyga-sink", "sink", "g2-value"])
def test_analyze_returns_every_key(variant):
    model = perturb(micro(variant))
    r = analyze(model, token_batches(), layers_for_maps=[1])
    assert REQUIRED_KEYS <= set(r)
    assert set(r) == AnalysisResult.__required_keys__  # the documented type declares every key analyze writes
    assert_finite_json(r)
    L, H = model.cfg.n_layers, model.cfg.attention.n_heads
    assert r["variant"] == variant and r["n_layers"] == L and r["n_heads"] == H
    for key in ("f_attn_per_layer", "sink_eps_per_layer", "m_act_per_layer", "m_act_ratio_per_layer"):
        assert len(r[key]) == L and all(isinstance(x, float) and math.isfinite(x) for x in r[key]), key
    assert len(r["sink_alpha"]) == L and all(len(a) == H for a in r["sink_alpha"])
    for key in ("f_attn", "sink_eps", "m_act", "m_act_ratio", "val_loss", "val_ppl"):
        assert math.isfinite(r[key]), key
    assert r["n_tokens"] == 2 * 2 * 16 and r["n_sequences"] == 4 and r["seq_len"] == 16
    assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
    assert r["m_act"] == max(r["m_act_per_layer"])
    assert r["m_act_ratio"] == r["m_act_ratio_per_layer"][r["m_act_layer"]]
    assert r["m_act_ratio_max"] == max(r["m_act_ratio_per_layer"])
    assert r["f_attn"] == pytest.approx(sum(r["f_attn_per_layer"]) / L)
    assert set(r["attention_maps"]) == {"1"}
    amap = torch.tensor(r["attention_maps"]["1"])
    assert amap.shape == (16, 16)
    assert torch.all(amap.triu(1) == 0)  # causal
    gated = model.cfg.attention.gate is not None
    for key in GATE_KEYS:
        assert (r[key] is not None) == gated, key
    if gated:
        assert 0 < r["gate_mean"] < 1 and len(r["gate_per_layer"]) == L
        assert r["gate_mean"] == pytest.approx(sum(r["gate_mean_per_layer"]) / L)  # equal counts per layer
        h = r["gate_histogram"]
        assert len(h["edges"]) == len(h["counts"]) + 1
        assert sum(h["counts"]) + h["underflow"] + h["overflow"] + h["nan"] == r["gate_count"]
    has_sink = model.cfg.attention.sink
    assert (r["sink_mass"] is not None) == has_sink
    assert (r["sink_mass_per_layer"] is not None) == has_sink
    if has_sink:
        assert 0 < r["sink_mass"] < 1
    assert "F-Attn" in format_analysis(r)


def test_analyze_leaves_model_unchanged_and_unhooked():
    model = perturb(micro("hyga-sink"))
    model.train()
    cores = [b.attn.core for b in model.blocks]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = token_batches(1)[0][:, :-1]
    model.eval()
    with torch.no_grad():
        before = model(ids)
    model.train()
    analyze(model, token_batches())
    assert model.training  # training mode restored
    assert all(b.attn.core is c for b, c in zip(model.blocks, cores))
    assert all_hooks(model) == []
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids), before)


def test_hooks_removed_and_cores_restored_after_an_error():
    model = micro("hyga")
    cores = [b.attn.core for b in model.blocks]
    bad = torch.full((2, 17), V + 5)  # outside the vocabulary

    def batches():
        yield token_batches(1)[0]
        yield bad

    with pytest.raises(GatedAttnError, match="outside the model's vocabulary"):
        analyze(model, batches())
    assert all(b.attn.core is c for b, c in zip(model.blocks, cores))
    assert all_hooks(model) == []

    with pytest.raises(RuntimeError, match="boom"), hooked(model, on_probs=lambda i, p: None,
                                                           on_hidden=lambda i, h: None, on_gate=lambda *a: None):
        assert all(isinstance(b.attn.core, ProbeCore) for b in model.blocks)
        assert all_hooks(model) != []
        raise RuntimeError("boom")
    assert all(b.attn.core is c for b, c in zip(model.blocks, cores))
    assert all_hooks(model) == []


def test_analyze_matches_direct_computation_on_one_batch():
    model = perturb(micro("gated"))
    batch = token_batches(1, B=3)[0]
    r = analyze(model, [batch])
    probs = collect_probs(model, batch[:, :-1])
    direct_f = [first_token_attention(p) for p in probs]
    direct_alpha = [sink_scores(p) for p in probs]
    assert r["f_attn_per_layer"] == pytest.approx(direct_f, abs=1e-9)
    assert r["f_attn"] == pytest.approx(sum(direct_f) / len(direct_f), abs=1e-9)
    for got, want in zip(r["sink_alpha"], direct_alpha):
        assert got == pytest.approx(want.tolist(), abs=1e-9)
    assert r["sink_eps"] == sink_fraction(direct_alpha, 0.3)
    # residual stream after each block, by running the blocks by hand
    with torch.no_grad():
        x = model.embed(batch[:, :-1])
        for i, block in enumerate(model.blocks):
            x = block(x)
            m = massive_activation(x)
            assert r["m_act_per_layer"][i] == pytest.approx(m["max_abs"], rel=1e-5)
            assert r["m_act_ratio_per_layer"][i] == pytest.approx(m["ratio"], rel=1e-5)
            assert r["m_act_location_per_layer"][i] == [m["batch"], m["position"], m["channel"]]
        loss = torch.nn.functional.cross_entropy(model.lm_head(model.norm(x)).flatten(0, 1), batch[:, 1:].flatten())
    assert r["val_loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_streaming_over_batches_equals_one_big_batch():
    model = perturb(micro("hyga"))
    batches = token_batches(3, B=2)
    split = analyze(model, batches)
    whole = analyze(model, [torch.cat(batches)])
    for key in ("f_attn", "sink_eps", "m_act", "gate_mean", "gate_frac_below_0.01", "val_loss"):
        assert split[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-12), key
    for a, b in zip(split["sink_alpha"], whole["sink_alpha"], strict=True):
        assert a == pytest.approx(b, rel=1e-9)
    assert split["gate_histogram"]["counts"] == whole["gate_histogram"]["counts"]
    assert split["m_act_location_per_layer"] == whole["m_act_location_per_layer"]


def _first_token_model(sink: bool = False):
    """Every query attends to key 0 (the BOS embedding is the only one with channel 0 set);
    o_proj and down_proj are zero, so the residual stream stays the embedding."""
    model = micro("sink" if sink else "baseline", qk_norm=False,
                  attention_fields={"qkv_bias": True, "rope": RopeConfig(fraction=0.0, original_max_len=16)})
    with torch.no_grad():
        model.embed.weight[:, 0] = 0.0
        model.embed.weight[0] = 0.0
        model.embed.weight[0, 0] = 1.0
        model.embed.weight[5, 7] = 50.0  # a massive activation carried by token 5
        for block in model.blocks:
            qkv = block.attn.qkv
            qkv.q_proj.weight.zero_()
            qkv.q_proj.bias.fill_(1.0)
            qkv.k_proj.weight.zero_()
            qkv.k_proj.weight[:, 0] = 1.0
            qkv.k_proj.bias.zero_()
            block.attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
    return model


def test_attention_forced_to_first_token_gives_f_attn_one():
    model = _first_token_model()
    batch = token_batches(2, low=6)[0]
    batch[1, 9] = 5  # sequence 1, input position 9 carries the massive activation
    r = analyze(model, [batch])
    assert r["f_attn"] == pytest.approx(1.0, abs=1e-6)
    assert r["sink_eps"] == 1.0 and r["sink_eps_per_layer"] == [1.0, 1.0]
    assert all(a == pytest.approx(1.0, abs=1e-6) for row in r["sink_alpha"] for a in row)
    assert r["m_act"] == 50.0 and r["m_act_per_layer"] == [50.0, 50.0]
    assert r["m_act_location_per_layer"] == [[1, 9, 7], [1, 9, 7]]


def test_uniform_attention_has_known_f_attn_and_sink_mass():
    """q = 0 makes attention uniform over the causal prefix: A[i, 0] = 1 / (i + 1); with a
    sink of logit 0 the sink is one more key: A[i, 0] = p_sink(i) = 1 / (i + 2)."""
    T = 16
    for sink in (False, True):
        model = _first_token_model(sink=sink)
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv.q_proj.bias.zero_()
        r = analyze(model, token_batches(1, low=6))
        extra = 1 if sink else 0
        f = sum(1 / (i + 1 + extra) for i in range(1, T)) / (T - 1)
        alpha = sum(1 / (i + 1 + extra) for i in range(T)) / T
        assert r["f_attn"] == pytest.approx(f, rel=1e-6)
        assert all(a == pytest.approx(alpha, rel=1e-6) for row in r["sink_alpha"] for a in row)
        if sink:
            assert r["sink_mass"] == pytest.approx(sum(1 / (i + 2) for i in range(T)) / T, rel=1e-6)
        else:
            assert r["sink_mass"] is None


def test_gate_statistics_match_hooked_scores():
    model = perturb(micro("gated"), scale=1.0)
    batches = token_batches(2)
    seen = []
    handles = [b.attn.gate.score.register_forward_hook(lambda m, i, o: seen.append(o.detach().double().flatten()))
               for b in model.blocks]
    r = analyze(model, batches)
    for h in handles:
        h.remove()
    scores = torch.cat(seen)
    assert r["gate_count"] == scores.numel() == 2 * 2 * 2 * 16 * 4 * 16  # L * batches * B * T * H * D
    assert r["gate_mean"] == pytest.approx(scores.mean().item(), rel=1e-9)
    assert r["gate_frac_below_0.01"] == pytest.approx((scores < 0.01).double().mean().item())
    assert r["gate_frac_below_0.001"] == pytest.approx((scores < 0.001).double().mean().item())
    assert r["gate_frac_below_0.01"] > 0  # scale 1.0 perturbation puts some scores near 0


def test_hyga_reports_all_gate_scores():
    L, B, T, H, D = 2, 2, 16, 4, 16
    r = analyze(perturb(micro("hyga")), token_batches(1))
    assert set(r["gate_per_score"]) == {"score", "c.score"}
    assert r["gate_per_score"]["score"]["count"] == L * B * T * H * D
    assert r["gate_per_score"]["c.score"]["count"] == L * B * T * H
    assert r["gate_count"] == L * B * T * H * (D + 1)
    r = analyze(perturb(micro("hyga-mulfusion")), token_batches(1))
    assert set(r["gate_per_score"]) == {"score", "h_score", "c.score"}


def test_static_gate_counts_every_token():
    model = micro("g1-static")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.gate.x.logits.copy_(torch.randn_like(block.attn.gate.x.logits))
    r = analyze(model, token_batches(1))
    assert r["gate_count"] == 2 * 2 * 16 * 4 * 16
    want = torch.cat([torch.sigmoid(b.attn.gate.x.logits.detach()).double().flatten() for b in model.blocks]).mean()
    assert r["gate_mean"] == pytest.approx(want.item(), rel=1e-9)


def test_probe_rejects_bad_map_layer_and_non_gatedlm():
    with pytest.raises(GatedAttnError, match="layer 5 does not exist"):
        Probe(micro(), map_layers=[5])
    with pytest.raises(GatedAttnError, match="not a GatedLM-shaped model"):
        analyze(torch.nn.Linear(2, 2), token_batches(1))
    with pytest.raises(GatedAttnError, match="no batches"):
        analyze(micro(), [])


# --------------------------------------------------------------------------- data-backed


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    rng = random.Random(0)
    words = "the gate sink softmax token layer head query key value attention model loss".split()
    root = tmp_path_factory.mktemp("analyze_data")
    src = root / "docs.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for _ in range(40):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(150))}) + "\n")
    out = root / "data"
    prepare([src], out, vocab_size=300, val_fraction=0.3, seed=0, progress=False)
    return out


@pytest.fixture(scope="module")
def data(data_dir):
    return TokenData(data_dir)


def data_model(data, variant="gated"):
    torch.manual_seed(1)
    return perturb(micro(variant, vocab_size=data.vocab_size, bos_token_id=data.bos_id), scale=0.05)


def test_extrapolate_plain_at_1x_equals_analyze(data):
    model = data_model(data)
    rotaries = [b.attn.rotary for b in model.blocks]
    ids = next(data.val_batches(seq_len=16, batch_size=2))[:, :-1]
    with torch.no_grad():
        before = model(ids)
    r = analyze(model, data.val_batches(seq_len=16, batch_size=4, max_batches=2))
    e = extrapolate(model, data, multiples=(1, 2, 4), methods=("plain", "ntk", "yarn"), tokens=2 * 4 * 16,
                    batch_size=2)
    assert e["train_len"] == 16 and e["lengths"] == [16, 32, 64] and e["skipped"] == []
    assert e["n_tokens"] == [128, 128, 128]  # the same val tokens at every length
    for method in ("plain", "ntk", "yarn"):
        losses, beyond = e["methods"][method], e["loss_beyond"][method]
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
        assert beyond[0] is None and all(math.isfinite(x) for x in beyond[1:])
    assert extrapolation_curves(e)["yarn"] == {"lengths": [16, 32, 64], "loss": e["methods"]["yarn"]}
    plain, ntk, yarn = (e["methods"][m] for m in ("plain", "ntk", "yarn"))
    assert r["n_tokens"] == e["n_tokens"][0]
    assert plain[0] == pytest.approx(r["val_loss"], abs=1e-5)  # same windows; only the attention kernel differs
    assert yarn[0] == plain[0] and ntk[0] == plain[0]  # scaling by 1 is no scaling
    assert yarn[1] != plain[1] and ntk[1] != plain[1]  # factor 2 changes the rotation
    assert all(b.attn.rotary is rot for b, rot in zip(model.blocks, rotaries))
    assert all_hooks(model) == []
    with torch.no_grad():
        assert torch.equal(model(ids), before)
    assert_finite_json(e)
    assert "plain" in format_extrapolation(e)


def test_extrapolate_skips_lengths_the_val_split_cannot_hold(data):
    model = data_model(data, "baseline")
    too_long = data.val_tokens // 16 + 1
    e = extrapolate(model, data, multiples=(1, too_long), methods=("plain", "linear"))
    assert e["n_tokens"][1] is None
    assert e["skipped"] == [{"multiple": too_long, "length": 16 * too_long,
                             "reason": f"the val split has {data.val_tokens} tokens, fewer than one window of "
                                       f"{16 * too_long}"}]
    for method in ("plain", "linear"):
        loss = e["methods"][method]
        assert math.isfinite(loss[0]) and loss[1] is None
    assert e["methods"]["plain"][0] == e["methods"]["linear"][0]
    assert_finite_json(e)
    with pytest.raises(GatedAttnError, match="unknown RoPE method 'rope2'"):
        extrapolate(model, data, methods=("plain", "rope2"))


# --------------------------------------------------------------------------- CLI


@pytest.fixture()
def cli(monkeypatch):
    modules = tuple(gatedattn.cli.SUBCOMMAND_MODULES)
    if "gatedattn.analysis.cli" not in modules:
        monkeypatch.setattr(gatedattn.cli, "SUBCOMMAND_MODULES", modules + ("gatedattn.analysis.cli",))
    return gatedattn.cli.main


@pytest.fixture()
def model_dir(tmp_path, data):
    return data_model(data, "hyga").save_pretrained(tmp_path / "model")


def test_cli_analyze_json(cli, capsys, model_dir, data_dir, tmp_path, unrendered_plots):
    out = tmp_path / "result.json"
    rc = cli(["analyze", "--model", str(model_dir), "--data", str(data_dir), "--json", "--batches", "2",
              "--batch-size", "2", "--layers", "0,1", "--device", "cpu", "--out", str(out),
              "--plots", str(tmp_path / "plots")])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    names = {"f_attn_per_layer.png", "m_act_per_layer.png", "attention_maps.png", "gate_histogram.png",
             "first_token_map.png", "sink_profile.png"}
    assert {p.name for p in (tmp_path / "plots").iterdir()} == names
    assert sorted(Path(p).name for p in r.pop("plots")) == sorted(names)
    assert json.loads(out.read_text()).pop("plots") is not None
    assert REQUIRED_KEYS <= set(r)
    assert r["variant"] == "hyga" and r["seq_len"] == 16 and r["n_tokens"] == 2 * 2 * 16
    assert set(r["attention_maps"]) == {"0", "1"} and r["gate_mean"] is not None
    written = json.loads(out.read_text())
    written.pop("plots")
    assert written == r
    data = TokenData(data_dir)
    assert r["first_token"] == {"mode": "bos", "id": data.bos_id, "why": "auto: a gatedattn model: `data prepare` starts every training sequence with BOS"}
    assert r["windows"] == {"count": 4, "length": 16, "source": "data", "data": str(data_dir),
                            "documents": data.manifest.val.documents, "seed": 0}
    # the same windows (one validation document each) through the Python API give the same numbers
    windows = document_windows(val_documents(data), 16, 4, data.bos_id)
    direct = analyze(load_any(model_dir), windows.split(2), layers_for_maps=[0, 1])
    assert r["f_attn"] == direct["f_attn"] and r["val_loss"] == direct["val_loss"]


def test_cli_analyze_table_and_recorded_data_dir(cli, capsys, tmp_path, data, data_dir):
    """Without --data, a trainer-written model uses the data dir its run recorded."""
    run = tmp_path / "run"
    ckpt = data_model(data, "hyga").save_pretrained(run / "checkpoints" / "step_00000010")
    final = data_model(data, "hyga").save_pretrained(run / "final")
    assert cli(["analyze", "--model", str(final), "--seq-len", "8", "--batches", "1"]) == 2
    assert "--data is required" in capsys.readouterr().err
    (run / "config.json").write_text(json.dumps({"train": {"data_dir": str(data_dir)}, "model": {}}))
    for model_dir in (final, ckpt):
        assert cli(["analyze", "--model", str(model_dir), "--seq-len", "8", "--batches", "1"]) == 0
        text = capsys.readouterr().out
        assert "F-Attn" in text and "gate mean" in text and "hyga" in text
    (ckpt / "checkpoint.json").write_text(json.dumps({"step": 10, "train": {"data_dir": str(tmp_path / "gone")}}))
    assert cli(["analyze", "--model", str(ckpt)]) == 2
    assert "which is not there; pass --data" in capsys.readouterr().err


def test_cli_extrapolate_json(cli, capsys, model_dir, data_dir):
    rc = cli(["extrapolate", "--model", str(model_dir), "--data", str(data_dir), "--multiples", "1,2",
              "--methods", "plain,yarn", "--json", "--batch-size", "2"])
    assert rc == 0
    e = json.loads(capsys.readouterr().out)
    assert e["lengths"] == [16, 32] and set(e["methods"]) == {"plain", "yarn"}
    assert all(math.isfinite(x) for losses in e["methods"].values() for x in losses)


@pytest.mark.parametrize("command", ["analyze", "extrapolate"])
def test_cli_bad_model_path_is_one_line_exit_2(cli, capsys, tmp_path, data_dir, command):
    rc = cli([command, "--model", str(tmp_path / "missing"), "--data", str(data_dir)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "model directory not found" in err and "Traceback" not in err


def test_cli_vocab_mismatch_is_an_error(cli, capsys, tmp_path, data_dir):
    small = micro("baseline", vocab_size=97).save_pretrained(tmp_path / "small")
    assert cli(["analyze", "--model", str(small), "--data", str(data_dir)]) == 2
    assert "vocabulary has 97" in capsys.readouterr().err


def test_load_any_reads_our_format_and_rejects_unknown(tmp_path, data):
    model = data_model(data, "gated")
    loaded = load_any(model.save_pretrained(tmp_path / "m"))
    assert isinstance(loaded, GatedLM) and loaded.cfg == model.cfg
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(GatedAttnError):
        load_any(other)


def test_load_any_is_the_one_loader(tmp_path, data):
    """analysis reads models through gatedattn.hf.load_model: the same model, the same refusals."""
    from gatedattn.hf import load_model

    path = data_model(data, "gated").save_pretrained(tmp_path / "m")
    ours, theirs = load_any(path), load_model(path)
    assert ours.cfg == theirs.cfg and all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                                            theirs.state_dict().values()))
    two = tmp_path / "two"  # a directory of two GGUF files: both refuse it alike
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"GGUF")
    errors = []
    for load in (load_any, load_model):
        with pytest.raises(GatedAttnError) as e:
            load(two)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "holds 2 .gguf files" in errors[0]


def test_a_gated_lm_is_scored_by_its_fused_head_and_loss():
    """analyze scores a GatedLM through forward(targets=...): its loss equals the logits'
    cross-entropy, and no log-softmax over (B, T, V) logits runs; another model (here the
    same one behind a plain wrapper) is scored through its logits, to the same loss."""
    from op_counts import Ops

    model = perturb(micro("gated-headwise"))
    batches = token_batches(2, B=2)

    class Plain(torch.nn.Module):  # not a GatedLM: analyze falls back to the logits
        def __init__(self, lm):
            super().__init__()
            self.lm, self.cfg, self.blocks = lm, lm.cfg, lm.blocks

        def forward(self, ids):
            return self.lm(ids)

    with Ops() as ops:
        fused = analyze(model, batches)
    assert not ops.count["_log_softmax"] and ops.count["logsumexp"] > 0
    with Ops() as ops:
        plain = analyze(Plain(model), batches)
    assert ops.count["_log_softmax"] > 0
    with torch.no_grad():
        direct = sum(torch.nn.functional.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten(),
                                                       reduction="sum").item() for b in batches)
    n = sum(b[:, 1:].numel() for b in batches)
    assert fused["val_loss"] == pytest.approx(direct / n, rel=1e-6)
    assert plain["val_loss"] == pytest.approx(direct / n, rel=1e-6)
