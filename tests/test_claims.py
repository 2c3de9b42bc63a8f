"""Claim verdicts on hand-made results: each rule can say held, did not hold, not measurable."""

import pytest

from gatedattn.reproduce.claims import HELD, NOT_HELD, NOT_MEASURABLE, compare, judge_all


def stat(*values):
    import statistics

    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "values": list(values)}


def results(**summary):
    return {"summary": summary}


def test_lower_loss_held_with_one_seed_notes_unknown_noise():
    r = results(baseline={"val_loss": stat(4.0)}, gated={"val_loss": stat(3.9)})
    v = compare(r, "gated", "baseline", "val_loss")
    assert v.status == HELD and "seed noise is unknown" in v.measured


def test_difference_within_seed_noise_is_not_measurable():
    r = results(baseline={"val_loss": stat(4.0, 3.8, 4.2)}, gated={"val_loss": stat(3.95, 4.1, 3.8)})
    assert compare(r, "gated", "baseline", "val_loss").status == NOT_MEASURABLE


def test_difference_beyond_seed_noise():
    r = results(baseline={"val_loss": stat(4.00, 4.01, 4.02)}, gated={"val_loss": stat(3.90, 3.91, 3.90)})
    assert compare(r, "gated", "baseline", "val_loss").status == HELD
    assert compare(r, "baseline", "gated", "val_loss").status == NOT_HELD


def test_ratio_claims_need_the_factor():
    r = results(baseline={"f_attn": stat(0.10)}, gated={"f_attn": stat(0.09)})
    weak = compare(r, "gated", "baseline", "f_attn", min_ratio=0.5)
    assert weak.status == NOT_MEASURABLE and "not by the 50 %" in weak.measured
    r = results(baseline={"f_attn": stat(0.10)}, gated={"f_attn": stat(0.12)})
    assert compare(r, "gated", "baseline", "f_attn", min_ratio=0.5).status == NOT_HELD
    r = results(baseline={"sink_eps": stat(0.0)}, gated={"sink_eps": stat(0.0)})
    assert compare(r, "gated", "baseline", "sink_eps").status == NOT_MEASURABLE
    r = results(baseline={"f_attn": stat(0.10)}, gated={"f_attn": stat(0.04)})
    assert compare(r, "gated", "baseline", "f_attn", min_ratio=0.5).status == HELD


def test_missing_variant_is_not_measurable():
    assert compare(results(baseline={"val_loss": stat(4.0)}), "gated", "baseline", "val_loss").status == NOT_MEASURABLE


def test_every_claim_judges_a_full_result():
    summary = {
        "baseline": {"val_loss": stat(4.0), "f_attn": stat(0.2), "sink_eps": stat(0.3), "m_act": stat(300.0),
                     "tokens_per_s": stat(1000.0), "ext_yarn_longest": stat(6.0)},
        "gated": {"val_loss": stat(3.9), "f_attn": stat(0.02), "sink_eps": stat(0.0), "m_act": stat(40.0),
                  "gate_mean": stat(0.2), "gate_frac_below_0.01": stat(0.1), "tokens_per_s": stat(900.0),
                  "ext_yarn_longest": stat(5.0)},
    }
    rows = judge_all({"summary": summary, "gate_cost": {}, "step_time": {"baseline": 1.0, "gated": 1.11}})
    by = {r["key"]: r["verdict"] for r in rows}
    assert by["ga-loss"] == by["ga-sink"] == by["ga-mact"] == by["ga-sparse"] == by["ga-extrapolation"] == HELD
    assert by["ga-overhead"] == NOT_HELD  # 11 % slower
    assert by["ga-stability"] == by["hyga-loss"] == by["ga-headwise"] == NOT_MEASURABLE
    assert all(r["measured"] for r in rows)


def test_no_sink_in_baseline_makes_sink_claims_not_measurable():
    summary = {"baseline": {"f_attn": stat(0.005)}, "gated": {"f_attn": stat(0.006)}}
    by = {r["key"]: r for r in judge_all({"summary": summary})}
    assert by["ga-sink"]["verdict"] == NOT_MEASURABLE and "no sink" in by["ga-sink"]["measured"]


@pytest.mark.parametrize("base_div,gated_div,expected", [([3e-2], [], HELD), ([], [3e-2], NOT_HELD), ([], [], NOT_MEASURABLE)])
def test_stability_claim_from_lr_study(base_div, gated_div, expected):
    runs = [{"variant": v, "lr": lr, "diverged": lr in (base_div if v == "baseline" else gated_div), "spikes": 0}
            for lr in (1e-3, 3e-2) for v in ("baseline", "gated")]
    by = {r["key"]: r["verdict"] for r in judge_all({"summary": {}, "lr_study": {"runs": runs}})}
    assert by["ga-stability"] == expected
