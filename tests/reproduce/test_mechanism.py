"""The Bigram-Backcopy generator, the per-class probe, the mechanism claims and the study end to end."""

import json
import math

import numpy as np
import pytest
import torch

from gatedattn.cli import main
from gatedattn.data import TokenData
from gatedattn.data.backcopy import CHAIN_LEN, FALLBACK_TEXT, BigramBackcopy
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.reproduce.verdicts import HELD, NOT_HELD, NOT_MEASURABLE, uniform_first_token_attention
from gatedattn import paper as P
from gatedattn.reproduce.mechanism.claims import MECHANISM_CLAIMS, judge_mechanism
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.mechanism.probe import measure, query_classes
from gatedattn.reproduce.mechanism.summary import at_layer, strongest_layer


@pytest.fixture(scope="module")
def task():
    return BigramBackcopy.from_text(FALLBACK_TEXT, source="test passage")


# ------------------------------------------------------------------------------ generator
def test_bos_first_and_every_trigger_copies_the_token_before_it(task):
    seqs = task.sample(400, 64, seed=0)
    assert (seqs[:, 0] == task.bos_id).all() and (seqs[:, 1:] < task.n_chars).all()
    body = seqs[:, 1:]
    trig = task.is_trigger(body)
    assert not trig[:, 0].any(), "the first token has no token before it to copy, so it is never a trigger"
    assert not (trig[:, :-1] & trig[:, 1:]).any(), "a trigger never follows a trigger"
    after = trig[:, 1:-1]  # body[:, i] is a trigger for i = 1..T-2; body[:, i+1] must equal body[:, i-1]
    assert after.sum() > 1000
    np.testing.assert_array_equal(body[:, 2:][after], body[:, :-2][after])


def _bigram_counts(task, seqs):
    body = seqs[:, 1:]
    cur, nxt = body[:, :-1].reshape(-1), body[:, 1:].reshape(-1)
    ordinary = ~task.is_trigger(cur)
    counts = np.zeros((task.n_chars, task.n_chars))
    np.add.at(counts, (cur[ordinary], nxt[ordinary]), 1)
    return counts


def _within_binomial_noise(counts, table, k=4.5):
    n = counts.sum(1, keepdims=True)
    rows = n[:, 0] >= 200
    p_hat = counts[rows] / n[rows]
    std = np.sqrt(table[rows] * (1 - table[rows]) / n[rows]) + 1e-3 / np.sqrt(n[rows])
    return bool((np.abs(p_hat - table[rows]) <= k * std).all()), int(rows.sum())


def test_bigram_frequencies_match_the_table_outside_triggers(task):
    counts = _bigram_counts(task, task.sample(3000, 64, seed=1))
    ok, rows = _within_binomial_noise(counts, task.table)
    assert ok and rows >= 15
    # the check has power: the same counts against a shuffled table fail it
    assert not _within_binomial_noise(counts, task.table[::-1])[0]


def test_table_estimated_from_text(task):
    assert task.n_chars == 24 and task.chars[0] == " "
    assert [task.chars[t] for t in task.triggers] == ["e", "t", "a"]  # most frequent after the space
    np.testing.assert_allclose(task.table.sum(1), 1.0)
    assert (task.table[np.ix_(task.triggers, task.triggers)] == 0).all()
    assert (task.initial[list(task.triggers)] == 0).all()
    h, a = task.chars.index("h"), task.chars.index("a")
    t = task.chars.index("t")
    assert task.table[t, h] > 0.3 and task.table[t, h] > task.table[t, a]  # "th" is common in English


def _from_text_reference(text: str, n_chars: int, n_triggers: int, smoothing: float = 0.1):
    """``from_text`` in plain Python: chars, table, initial and triggers."""
    from collections import Counter

    text = " ".join(text.lower().split())
    freq = Counter(text)
    chars = [c for c, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:n_chars]]
    ids = [chars.index(c) if c in chars else -1 for c in text]
    counts = np.zeros((n_chars, n_chars))
    for a, b in zip(ids, ids[1:]):
        if a >= 0 and b >= 0:
            counts[a, b] += 1
    triggers = [i for i, c in enumerate(chars) if c != " "][:n_triggers]
    table = counts + smoothing
    table[np.ix_(triggers, triggers)] = 0.0
    initial = np.bincount([i for i in ids if i >= 0], minlength=n_chars) + smoothing
    initial[triggers] = 0.0
    return tuple(chars), table / table.sum(1, keepdims=True), initial / initial.sum(), tuple(triggers)


def test_table_from_text_equals_the_plain_python_count():
    """Whitespace of every kind collapses to one space between words, none at the ends (as
    ``str.split``), capitals count as their lower case, and ties go to the lower code point."""
    import random

    rng = random.Random(0)
    alphabet = "abcdeABE  \n\t\r\x0b\x1c\x85\u00a0\u1680\u2003\u2029\u3000é.,"
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(30, 200)))
        got = BigramBackcopy.from_text(text, n_chars=6, n_triggers=2)
        chars, table, initial, triggers = _from_text_reference(text, 6, 2)
        assert (got.chars, got.triggers) == (chars, triggers), text
        np.testing.assert_allclose(got.table, table, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.initial, initial, rtol=0, atol=1e-12)
    from gatedattn.data.backcopy import _LAST_SPACE

    assert max(c for c in range(0x110000) if chr(c).isspace()) == _LAST_SPACE  # the table misses no whitespace


def test_same_seed_same_data(task, tmp_path):
    np.testing.assert_array_equal(task.sample(8, 64, seed=5), task.sample(8, 64, seed=5))
    assert not np.array_equal(task.sample(8, 64, seed=5), task.sample(8, 64, seed=6))
    a = task.write_data_dir(tmp_path / "a", train_tokens=20_000, val_tokens=5_000, seed=3)
    b = task.write_data_dir(tmp_path / "b", train_tokens=20_000, val_tokens=5_000, seed=3)
    assert (a / "train.bin").read_bytes() == (b / "train.bin").read_bytes()
    assert BigramBackcopy.from_text(FALLBACK_TEXT).fingerprint() == task.fingerprint()


def test_data_dir_feeds_the_trainer_batches(task, tmp_path):
    data = TokenData(task.write_data_dir(tmp_path / "d", train_tokens=3 * CHAIN_LEN, val_tokens=CHAIN_LEN),
                     verify=True)
    assert data.vocab_size == task.vocab_size and data.bos_id == task.bos_id
    rows = data.train_batch(0, range(16), global_batch=16, seq_len=64, seed=0)
    assert (rows[:, 0] == task.bos_id).all()
    val = next(data.val_batches(seq_len=64, batch_size=8))  # within one chain: the copy rule holds
    body = val[:, 1:].numpy()
    trig = task.is_trigger(body[:, 1:-1])
    np.testing.assert_array_equal(body[:, 2:][trig], body[:, :-2][trig])
    assert data.decode([task.chars.index(c) for c in "the "]) == "the "


def test_default_table_falls_back_to_the_built_in_passage(monkeypatch):
    import gatedattn.data.backcopy as bc
    import gatedattn.data.corpus as corpus

    def missing():
        raise GatedAttnError("the default corpus needs packages")

    monkeypatch.setattr(corpus, "default_corpus", missing)
    monkeypatch.setattr(bc, "default_corpus", missing)  # the name as backcopy imported it
    bc._default.cache_clear()
    try:
        fallback = BigramBackcopy.default()
        assert "built-in" in fallback.source and fallback.n_chars == 24
    finally:
        bc._default.cache_clear()


@pytest.mark.parametrize("kw,match", [(dict(n_triggers=0), "n_triggers=0"), (dict(n_chars=40), "fewer than n_chars"),
                                      (dict(n_triggers=23), "n_triggers=23")])
def test_bad_task_settings(kw, match):
    with pytest.raises(GatedAttnError, match=match):
        BigramBackcopy.from_text(FALLBACK_TEXT, **kw)


# ------------------------------------------------------------------------------ probe
def _model(task, variant, layers=2):
    cfg = ModelConfig.from_preset("toy", variant, vocab_size=task.vocab_size, max_seq_len=64, qk_norm=False)
    model = GatedLM(cfg.replace(n_layers=layers)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.q_proj.weight.zero_()  # every logit 0: uniform causal attention
            if block.attn.gate is not None:
                for p in block.attn.gate.parameters():
                    p.zero_()  # every gate logit 0: sigmoid gives 0.5
    return model


def test_uniform_attention_gives_the_uniform_levels(task):
    batch = task.sample(16, 32, seed=2)
    m = measure(_model(task, "gated"), batch, task)
    trig, ordi = query_classes(batch[:, :-1], task)
    pos = torch.arange(32).expand(16, 32)
    assert m["bos_attn_ordinary"] == pytest.approx(float((1.0 / (pos + 1))[ordi].double().mean()), rel=1e-6)
    assert m["bos_attn_trigger"] == pytest.approx(m["uniform_bos_attn_trigger"], rel=1e-6)
    assert m["prev_attn_trigger"] == pytest.approx(m["uniform_bos_attn_trigger"], rel=1e-6)
    assert m["f_attn"] == pytest.approx(uniform_first_token_attention(31), rel=1e-6)
    assert m["gate_trigger"] == pytest.approx(0.5) and m["gate_ordinary"] == pytest.approx(0.5)
    assert m["sink_mass_ordinary"] is None and len(m["bos_attn_ordinary_per_layer"]) == 2


def test_learnable_sink_mass_and_hyga_effective_gate(task):
    batch = task.sample(8, 16, seed=3)
    model = _model(task, "sink", layers=1)
    with torch.no_grad():
        model.blocks[0].attn.sink.fill_(math.log(3.0))  # the sink weighs as 3 keys
    m = measure(model, batch, task)
    _, ordi = query_classes(batch[:, :-1], task)
    pos = torch.arange(16).expand(8, 16).double()
    assert m["sink_mass_ordinary"] == pytest.approx(float((3 / (pos + 1 + 3))[ordi].mean()), rel=1e-5)
    assert m["bos_attn_ordinary"] == pytest.approx(float((1 / (pos + 1 + 3))[ordi].mean()), rel=1e-5)
    hyga = measure(_model(task, "hyga-lowrank", layers=1), batch, task)
    assert hyga["gate_ordinary"] == pytest.approx(0.25)  # fused X+H gate 0.5 times the cross-head gate 0.5


def test_norms_and_losses_match_a_direct_computation(task):
    batch = torch.as_tensor(task.sample(8, 24, seed=4))
    model = _model(task, "baseline", layers=1)
    inputs = batch[:, :-1]
    with torch.no_grad():
        x = model.embed(inputs)
        v = model.blocks[0].attn.qkv.v_proj(model.blocks[0].attn_norm(x))
        h = model.blocks[0](x)
        before = model(inputs)
        ce = torch.nn.functional.cross_entropy(before.flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
    m = measure(model, batch, task)
    assert m["value_norm_bos"] == pytest.approx(float(v[:, 0].norm(dim=-1).mean()), rel=1e-5)
    assert m["value_norm_other"] == pytest.approx(float(v[:, 1:].norm(dim=-1).mean()), rel=1e-5)
    assert m["resid_norm_bos"] == pytest.approx(float(h[:, 0].norm(dim=-1).mean()), rel=1e-4)
    trig, ordi = query_classes(inputs, task)
    ce = ce.view(8, 24).double()
    assert m["loss_copy"] == pytest.approx(float(ce[trig].mean()), rel=1e-4)
    assert m["loss_bigram"] == pytest.approx(float(ce[ordi].mean()), rel=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), before)  # the hooks are gone and the model unchanged


def test_query_classes_exclude_bos(task):
    ids = np.array([[task.bos_id, 0, task.triggers[0], 0, 5]])
    trig, ordi = query_classes(ids, task)
    assert trig.tolist() == [[False, False, True, False, False]]
    assert ordi.tolist() == [[False, True, False, True, True]]


# ------------------------------------------------------------------------------ claims
def stat(*values):
    mean = float(np.mean(values))
    return {"mean": mean, "std": float(np.std(values, ddof=1)) if len(values) > 1 else None, "values": list(values)}


def verdicts(**summary):
    rows = judge_mechanism({"summary": summary, "config": {"seq_len": 64}})
    return {r["key"]: r for r in rows}


BASE = dict(f_attn=stat(0.5, 0.52, 0.48), sink_eps=stat(1.0, 1.0, 1.0), bos_attn_ordinary=stat(0.6, 0.62, 0.58),
            bos_attn_trigger=stat(0.01, 0.01, 0.01))


def test_sink_claim_held_and_not_held():
    assert verdicts(baseline=BASE)["mech-sink"]["verdict"] == HELD
    weak = {**BASE, "bos_attn_ordinary": stat(0.2, 0.22, 0.18)}
    row = verdicts(baseline=weak)["mech-sink"]
    assert row["verdict"] == NOT_HELD and "× the uniform level" in row["measured"]


def test_removal_claims_need_the_baseline_sink():
    gated = dict(bos_attn_ordinary=stat(0.1, 0.11, 0.09))
    assert verdicts(baseline=BASE, gated=gated)["mech-removes-gated"]["verdict"] == HELD
    worse = dict(bos_attn_ordinary=stat(0.8, 0.81, 0.79))
    assert verdicts(baseline=BASE, gated=worse)["mech-removes-gated"]["verdict"] == NOT_HELD
    no_sink = {**BASE, "f_attn": stat(0.08, 0.09, 0.07), "bos_attn_ordinary": stat(0.1, 0.1, 0.1)}
    row = verdicts(baseline=no_sink, gated=dict(bos_attn_ordinary=stat(0.01, 0.01, 0.01)))["mech-removes-gated"]
    assert row["verdict"] == NOT_MEASURABLE and "no sink" in row["measured"]
    # the rule reads the quantity the claim is about (BOS attention), not whether one head passes ε
    no_head = {**BASE, "sink_eps": stat(0.0, 0.0, 0.0)}
    assert verdicts(baseline=no_head, gated=gated)["mech-removes-gated"]["verdict"] == HELD
    weak = {**BASE, "bos_attn_ordinary": stat(0.2, 0.2, 0.2), "uniform_bos_attn_ordinary": stat(0.07, 0.07, 0.07)}
    row = verdicts(baseline=weak, gated=dict(bos_attn_ordinary=stat(0.01, 0.01, 0.01)))["mech-removes-gated"]
    assert row["verdict"] == NOT_MEASURABLE and "≥ 3× uniform" in row["measured"]  # 2.9x is not a sink to remove


def test_sink_claim_is_judged_beyond_seed_noise():
    """0.5 inside the seeds' band (mean ± 2·std) reads not measurable: one seed short of the
    line does not fail the claim, and two seeds just over it do not carry it."""
    one_low = {**BASE, "bos_attn_ordinary": stat(0.9, 0.9, 0.4)}  # mean 0.73, std 0.29
    row = verdicts(baseline=one_low)["mech-sink"]
    assert row["verdict"] == NOT_MEASURABLE and "0.400" in row["measured"] and "within seed noise" in row["measured"]
    edge = {**BASE, "bos_attn_ordinary": stat(0.52, 0.51, 0.47)}
    assert verdicts(baseline=edge)["mech-sink"]["verdict"] == NOT_MEASURABLE
    assert verdicts(baseline={**BASE, "bos_attn_ordinary": stat(0.42, 0.41, 0.45)})["mech-sink"]["verdict"] == NOT_HELD
    assert verdicts(baseline={**BASE, "bos_attn_ordinary": stat(0.62, 0.61, 0.65)})["mech-sink"]["verdict"] == HELD


def _norms(v_bos, v_other, h_bos, h_other):
    return dict(value_norm_bos=stat(*v_bos), value_norm_other=stat(*v_other), resid_norm_bos=stat(*h_bos),
                resid_norm_other=stat(*h_other))


def test_drain_and_peak_claims():
    drained = {**BASE, **_norms((1, 1, 1), (4, 4, 2.5), (30, 30, 30), (10, 11, 12))}
    rows = verdicts(baseline=drained, gated=_norms((3, 3, 3), (4, 4, 4), (10, 10, 10), (10, 10, 10)))
    assert rows["mech-drain"]["verdict"] == HELD and rows["mech-peak"]["verdict"] == HELD
    assert rows["mech-drain-gated"]["verdict"] == HELD and rows["mech-peak-gated"]["verdict"] == HELD
    # one gated seed still drained: the line lies within the seeds' noise
    rows = verdicts(baseline=drained, gated=_norms((3, 3, 1), (4, 4, 4), (10, 10, 10), (10, 10, 10)))
    assert rows["mech-drain-gated"]["verdict"] == NOT_MEASURABLE
    # every gated seed still drained: the drain did not vanish
    rows = verdicts(baseline=drained, gated=_norms((1, 1, 1), (4, 4, 4), (10, 10, 10), (10, 10, 10)))
    assert rows["mech-drain-gated"]["verdict"] == NOT_HELD
    # one baseline seed without the drain: within noise, so its removal is not measurable; no peak: fails
    partial = {**BASE, **_norms((1, 1, 3), (4, 4, 4), (5, 5, 5), (10, 10, 10))}
    rows = verdicts(baseline=partial, gated=_norms((3, 3, 3), (4, 4, 4), (10, 10, 10), (10, 10, 10)))
    assert rows["mech-drain"]["verdict"] == NOT_MEASURABLE and rows["mech-peak"]["verdict"] == NOT_HELD
    assert rows["mech-drain-gated"]["verdict"] == NOT_MEASURABLE and "0.42" in rows["mech-drain-gated"]["measured"]


def test_claims_read_the_baseline_strongest_layer():
    def final(bos_per_layer):
        return {"bos_attn_ordinary_per_layer": bos_per_layer, "bos_attn_ordinary": sum(bos_per_layer) / 2}

    base = [{"final": final([0.1, 0.9])}, {"final": final([0.2, 0.7])}]
    assert strongest_layer(base) == 1
    assert at_layer(final([0.3, 0.05]), 1)["bos_attn_ordinary"] == 0.05  # every variant read at that layer
    assert at_layer(final([0.3, 0.05]), None)["bos_attn_ordinary"] == 0.175
    assert strongest_layer([]) is None


def test_gate_selectivity_claim():
    sel = verdicts(baseline=BASE, gated=dict(gate_trigger=stat(0.8, 0.82, 0.79), gate_ordinary=stat(0.1, 0.12, 0.11)))
    assert sel["mech-selective-gated"]["verdict"] == HELD
    open_everywhere = dict(gate_trigger=stat(0.8, 0.82, 0.79), gate_ordinary=stat(0.6, 0.61, 0.6))
    row = verdicts(baseline=BASE, gated=open_everywhere)["mech-selective-gated"]
    assert row["verdict"] == NOT_HELD and "not closed elsewhere" in row["measured"]
    noisy = dict(gate_trigger=stat(0.5, 0.8, 0.2), gate_ordinary=stat(0.45, 0.1, 0.7))
    assert verdicts(baseline=BASE, gated=noisy)["mech-selective-gated"]["verdict"] == NOT_MEASURABLE
    assert "mech-selective-gated-headwise" not in sel  # not run, no row


def test_learnable_sink_claim():
    took = dict(bos_attn_ordinary=stat(0.05, 0.06, 0.05), sink_mass_ordinary=stat(0.7, 0.72, 0.69))
    assert verdicts(baseline=BASE, sink=took)["mech-learnable-sink"]["verdict"] == HELD
    elsewhere = dict(bos_attn_ordinary=stat(0.05, 0.06, 0.05), sink_mass_ordinary=stat(0.1, 0.1, 0.12))
    assert verdicts(baseline=BASE, sink=elsewhere)["mech-learnable-sink"]["verdict"] == NOT_HELD
    no_sink = {**BASE, "bos_attn_ordinary": stat(0.1, 0.1, 0.1)}
    assert verdicts(baseline=no_sink, sink=took)["mech-learnable-sink"]["verdict"] == NOT_MEASURABLE
    # a sink that takes no mass while BOS keeps it (within seed noise of the baseline) is judged, not
    # left unmeasurable: the sink's own share decides
    ignored = dict(bos_attn_ordinary=stat(0.6, 0.55, 0.62), sink_mass_ordinary=stat(0.001, 0.0, 0.002))
    row = verdicts(baseline=BASE, sink=ignored)["mech-learnable-sink"]
    assert row["verdict"] == NOT_HELD and "the sink takes under half" in row["measured"]
    assert "seeds 0.001, 0.000, 0.002" in row["measured"]
    # one seed whose BOS keeps its attention: the line lies within the seeds' noise
    one_seed = dict(bos_attn_ordinary=stat(0.05, 0.5, 0.05), sink_mass_ordinary=stat(0.7, 0.4, 0.69))
    row = verdicts(baseline=BASE, sink=one_seed)["mech-learnable-sink"]
    assert row["verdict"] == NOT_MEASURABLE and "lies within seed noise of what BOS keeps" in row["measured"]
    both = verdicts(baseline=BASE, sink=ignored, **{"hyga-sink": took})
    assert both["mech-learnable-sink-hyga"]["verdict"] == HELD and both["mech-learnable-sink"]["verdict"] == NOT_HELD
    assert verdicts(baseline=BASE, **{"hyga-sink": dict(bos_attn_ordinary=stat(0.05, 0.06, 0.05))})[
        "mech-learnable-sink-hyga"]["verdict"] == NOT_MEASURABLE  # no sink share measured


# ------------------------------------------------------------------------------ config, CLI, end to end
@pytest.mark.parametrize("kw,match", [(dict(variants=("baseline", "g2-value")), r"variants='g2-value' is not allowed"),
                                      (dict(variants=("gated",)), "must include 'baseline'"),
                                      (dict(depths=(0,)), "depths"), (dict(workers=0), "workers=0"),
                                      (dict(positions="alibi"), r"positions='alibi' is not allowed.*'learned'"),
                                      (dict(norm="batch"), r"norm='batch' is not allowed"),
                                      (dict(schedule="linear"), r"schedule='linear' is not allowed"),
                                      (dict(beta2=1.0), r"beta2=1.0 must be < 1"),
                                      (dict(train_tokens=10), "train_tokens=10 must exceed seq_len"),
                                      (dict(embed_std=0.0), "embed_std=0.0 must be > 0"),
                                      (dict(d_model=0), "d_model=0 must be > 0"),
                                      (dict(seeds=10**9), "seeds=1000000000 must be <= 1000"),
                                      (dict(steps=10**12), "steps=1000000000000 must be <= 10000000")])
def test_bad_mechanism_config(kw, match):
    with pytest.raises(ConfigError, match=match):
        MechanismConfig(**kw)


def test_default_plan():
    plan = MechanismConfig().plan()
    assert len(plan) == 6 * 5 + 2 * 3 and plan[0][1] == 2
    assert {(v, s) for v, d, s in plan if d == 2} == {(v, s) for v in ("baseline", "gated") for s in range(3)}
    assert {v for v, d, _ in plan if d == 1} == {"baseline", "gated", "sink", "hyga", "hyga-lowrank", "hyga-sink"}
    assert {s for _, d, s in plan if d == 1} == set(range(5))
    assert len(MechanismConfig(seeds=2).plan()) == 6 * 2 + 2 * 2  # the deeper depths' seeds are capped


def test_default_training_work_within_its_budget():
    """The main job's mechanism part must stay within 2.3x the training work of the recipe
    the 10-minute budget was measured on (3 variants x 3 seeds at one layer, 2 x 3 at two)."""
    from gatedattn.reproduce.mechanism.run import model_parameters, training_work

    before = MechanismConfig(variants=("baseline", "gated", "sink"), seeds=3, deep_seeds=3)
    assert model_parameters(before, "baseline", 1) == 49024 and model_parameters(before, "hyga-sink", 1) == 61377
    ratio = training_work(MechanismConfig()) / training_work(before)
    assert 2.0 < ratio <= 2.3


def test_cli_rejects_flags_of_other_studies(capsys):
    assert main(["reproduce", "--study", "mechanism", "--preset", "tiny", "--quick"]) == 2
    assert "--preset do not apply to --study mechanism" in capsys.readouterr().err
    assert main(["reproduce", "--workers", "2", "--quick"]) == 2
    assert "--workers do not apply to --study main" in capsys.readouterr().err
    assert main(["reproduce", "--study", "lr", "--no-mechanism", "--quick"]) == 2
    assert "--no-mechanism do not apply to --study lr" in capsys.readouterr().err


def test_no_mechanism_leaves_out_part_one():
    from gatedattn.cli import build_parser
    from gatedattn.reproduce.cli import study_config
    from gatedattn.reproduce.studies import STUDIES

    parse = build_parser("reproduce").parse_args
    main_job = STUDIES["main"]
    assert study_config(main_job, parse(["reproduce", "--quick", "--no-mechanism"])).mechanism is None
    assert study_config(main_job, parse(["reproduce", "--quick"])).mechanism == MechanismConfig.quick()
    assert study_config(main_job, parse(["reproduce"])).mechanism == MechanismConfig()


def test_every_study_is_registered_once_with_its_flags():
    import dataclasses

    from gatedattn.cli import build_parser
    from gatedattn.reproduce.claims import CLAIMS
    from gatedattn.reproduce.studies import STUDIES, STUDY_OF_CONFIG
    from gatedattn.infra.settings import settings

    assert list(STUDIES) == ["main", "pretrained", "text", "mechanism", "lr", "rank", "calibrate",
                             "calibrate-mechanism"]
    assert len(STUDY_OF_CONFIG) == len(STUDIES)  # one config class per study
    parser_flags = {a for action in build_parser("reproduce")._subparsers._group_actions[0].choices["reproduce"]._actions
                    for a in action.option_strings}
    claim_keys = {c.key for c in CLAIMS}
    for study in STUDIES.values():
        assert study.help and set(study.flag_names()) <= parser_flags, study.name
        assert set(study.parts) <= set(STUDIES) and set(study.claims) <= claim_keys
        assert all(f.metadata.get("help") for f in dataclasses.fields(study.config)), study.name  # every field documented
        keys = {s.key for s in settings(study.config)} | {f.name for f in dataclasses.fields(study.config)}
        for flag, spec in study.flags.items():  # every flag sets a key its config has
            assert spec.key in keys or spec.key.split(".")[0] in keys, (study.name, flag)
        assert getattr(study.config, "STUDY", study.name) == study.name  # a config names the study it runs
    assert STUDIES["main"].parts == ("mechanism", "pretrained", "text")  # what the main job composes, in order
    assert STUDIES["main"].config().parts() == ("mechanism", "pretrained")  # natural text only with --with-text
    assert [s.key for s in STUDIES.values() if s.key] == ["lr_study", "rank_sweep"]


@pytest.mark.slow
def test_quick_mechanism_study_end_to_end(tmp_path, monkeypatch):
    import matplotlib.figure

    out = tmp_path / "mech"
    quick = ["reproduce", "--study", "mechanism", "--quick", "--steps", "24", "--set", "analysis_sequences=8",
             "--out", str(out)]  # the whole pipeline, not a grown sink
    assert main([*quick, "-q"]) == 0
    results = json.loads((out / "results.json").read_text())
    summary = results["depths"]["1"]["summary"]
    assert set(summary) == {"baseline", "gated"}
    assert 0 < summary["baseline"]["bos_attn_ordinary"]["mean"] < 1
    assert summary["gated"]["gate_trigger"]["mean"] is not None and summary["baseline"]["gate_trigger"] is None
    curve = results["depths"]["1"]["runs"]["baseline"][0]["curve"]
    assert len(curve["step"]) >= 3 and len(curve["bos_attn_ordinary"]) == len(curve["step"])
    claims = {c["key"]: c["verdict"] for c in results["depths"]["1"]["claims"]}
    assert set(claims) == {"mech-sink", "mech-removes-gated", "mech-selective-gated", "mech-drain", "mech-peak",
                           "mech-drain-gated", "mech-peak-gated"}
    report = (out / "report.md").read_text()
    for png in ("bos_attention_L1", "gate_score_L1"):
        assert (out / f"{png}.png").stat().st_size > 1000 and f"({png}.png)" in report
    assert "gatedattn reproduce --study mechanism" in report and "≥ 3× the uniform level" in report
    # the calls below prove reuse and report regeneration: their plots (checked above) are
    # laid out but not rendered to PNG, the costly part of each
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: None)
    again = main([*quick, "-q"])  # reuses the runs
    assert again == 0 and json.loads((out / "results.json").read_text())["depths"] == results["depths"]
    # --report-only judges the claims anew from results.json and writes the same report
    written, now = (out / "report.md").read_text(), json.loads((out / "results.json").read_text())
    tampered = {**now, "depths": {d: {**b, "claims": []} for d, b in now["depths"].items()}}
    (out / "results.json").write_text(json.dumps(tampered))
    assert main([*quick, "--report-only"]) == 0
    assert (out / "report.md").read_text() == written
    assert json.loads((out / "results.json").read_text())["depths"]["1"]["claims"] == results["depths"]["1"]["claims"]


def test_task_family_is_a_field():
    corpus = MechanismConfig()
    random = MechanismConfig(task_family="random", n_chars=43, trigger_share=0.05, task_seed=2)
    assert corpus.task().source != random.task().source and random.task().triggers == (40, 41, 42)
    assert random.task().fingerprint() == BigramBackcopy.random_sparse(
        n_chars=43, trigger_share=0.05, seed=2).fingerprint()
    from gatedattn.reproduce.mechanism.run import recipe_of

    assert recipe_of(random, "baseline")["task_family"] == "random"
    with pytest.raises(ConfigError, match=r"successors=30 must be in \[1, 21\]"):
        MechanismConfig(task_family="random", successors=30)
    with pytest.raises(ConfigError, match=r"task_family='zipf' is not allowed"):
        MechanismConfig(task_family="zipf")


def _fake_record(variant, seed, bos, sink=None):
    final = {"bos_attn_ordinary": bos, "bos_attn_ordinary_per_layer": [bos], "bos_attn_trigger": 0.01,
             "uniform_bos_attn_ordinary": 0.06, "uniform_bos_attn_trigger": 0.07, "sink_mass_ordinary": sink,
             "trigger_fraction": 0.2}
    curve = {"step": [0, 10], "bos_attn_ordinary": [0.06, bos], "sink_mass_ordinary": [None if sink is None else 0.05, sink]}
    return {"variant": variant, "depth": 1, "seed": seed, "final": final, "curve": curve, "final_loss": 2.0,
            "wall_seconds": 1.0, "train_seconds": 1.0}


def test_results_written_before_hyga_and_deep_seeds_still_render(tmp_path):
    """An older results.json (no deep_seeds, sink_init or task family in its config, no HyGA
    runs) renders; the report names the default variants it lacks and judges the sink claim."""
    from gatedattn.reproduce.mechanism.claims import judge_depths
    from gatedattn.reproduce.mechanism.report import mechanism_section
    from gatedattn.reproduce.mechanism.summary import build_results

    cfg = MechanismConfig(variants=("baseline", "gated", "sink"), depths=(1,), deep_variants=(), seeds=2)
    records = [_fake_record("baseline", s, 0.95) for s in range(2)] + [_fake_record("gated", s, 0.1) for s in range(2)]
    records += [_fake_record("sink", s, 0.9, sink=0.001) for s in range(2)]
    results = build_results(cfg, cfg.task(), records)
    for field in ("deep_seeds", "sink_init", "task_family", "trigger_share", "successors", "task_seed"):
        del results.config[field]
    text = "\n".join(mechanism_section(judge_depths(results), tmp_path))
    assert "Not in these results: `hyga`, `hyga-lowrank`, `hyga-sink`" in text
    row = next(line for line in text.splitlines() if "(`sink`) |" in line)
    assert "**did not hold**" in row and "seeds 0.001, 0.001" in row
    assert (tmp_path / "learnable_sink_L1.png").is_file() and (tmp_path / "seeds_L1.png").is_file()
    assert MechanismConfig.from_dict(results.config).deep_seeds == 3


def test_every_claim_quotes_what_the_papers_say():
    gate = dict(bos_attn_ordinary=stat(0.1, 0.11, 0.09), gate_trigger=stat(0.8, 0.8, 0.8),
                gate_ordinary=stat(0.05, 0.05, 0.05), sink_mass_ordinary=stat(0.9, 0.9, 0.9))
    rows = verdicts(baseline=BASE, **{v: gate for v in ("gated", "gated-headwise", "sink", "hyga", "hyga-lowrank",
                                                        "hyga-sink", "hyga-h", "hyga-c")})
    assert len(rows) == len(MECHANISM_CLAIMS)
    assert all(r["paper"] for r in rows.values())
    assert rows["mech-removes-gated"]["paper"] == P.GA_REMOVES_SINK and "0.467 → 0.048" in P.GA_REMOVES_SINK
    assert rows["mech-removes-hyga"]["paper"] == rows["mech-below-gated-hyga"]["paper"] == P.HYGA_SINK_LEFT
    assert "not reported" in rows["mech-removes-hyga-h"]["paper"]


def test_hyga_leaves_less_of_the_sink_than_gated():
    gated = dict(bos_attn_ordinary=stat(0.3, 0.32, 0.28))
    rows = verdicts(baseline=BASE, gated=gated, hyga=dict(bos_attn_ordinary=stat(0.1, 0.11, 0.09)))
    assert rows["mech-below-gated-hyga"]["verdict"] == HELD
    rows = verdicts(baseline=BASE, gated=gated, hyga=dict(bos_attn_ordinary=stat(0.5, 0.52, 0.48)))
    assert rows["mech-below-gated-hyga"]["verdict"] == NOT_HELD
    rows = verdicts(baseline=BASE, gated=gated, hyga=dict(bos_attn_ordinary=stat(0.1, 0.5, 0.3)))
    assert rows["mech-below-gated-hyga"]["verdict"] == NOT_MEASURABLE  # within seed noise
    assert "mech-below-gated-hyga" not in verdicts(baseline=BASE, hyga=gated)  # needs gated beside it
    no_sink = {**BASE, "bos_attn_ordinary": stat(0.1, 0.1, 0.1)}
    row = verdicts(baseline=no_sink, gated=gated, hyga=dict(bos_attn_ordinary=stat(0.01, 0.01, 0.01)))
    assert row["mech-below-gated-hyga"]["verdict"] == NOT_MEASURABLE
