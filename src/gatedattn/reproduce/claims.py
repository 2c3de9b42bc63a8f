"""The papers' claims, each judged against what one reproduction run measured.

A claim reads a ``results`` dict (see ``runner.py``: ``results["summary"][variant][metric]``
holds ``{"mean", "std", "values"}`` over seeds) and returns a ``Verdict``:

- ``held``: the measured difference goes the paper's way (and, with two or more seeds,
  is larger than the seed noise: |Δmean| > 2·sqrt(std_a² + std_b²));
- ``did not hold``: it goes the other way, beyond noise where noise is known;
- ``not measurable``: within seed noise, the needed variant or study was not run, or
  the effect the claim needs did not form at this budget.

A claim about *removing* a phenomenon is judged only where the baseline shows it:

- the sink: baseline F-Attn at least ``SINK_OVER_UNIFORM`` times the uniform value
  (uniform causal attention over T positions after BOS gives ``(1/T)·Σ_{i=1..T} 1/(i+1)``)
  and Sink^ε > 0 (:func:`sink_shown`);
- massive activations: baseline M-Act / median at least ``MASSIVE_RATIO``
  (:func:`massive_shown`).

A timing claim needs repeated, interleaved measurements (``results["step_time_samples"]``,
one list of seconds per variant, taken in rounds); it is judged on the per-round
overheads, and a difference within ``NOISE_K`` standard errors is *not measurable*
(:func:`_overhead`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from gatedattn import paper as P
from gatedattn.infra.fmt import fmt_mean_std as _fmt
from gatedattn.analysis.metrics import differs_beyond_noise

HELD, NOT_HELD, NOT_MEASURABLE = "held", "did not hold", "not measurable"
# Sink and massive-activation claims need the gated value at most this share of the
# baseline's (the paper reports 10x; a small run must at least show a clear reduction).
REDUCTION = 0.75
SINK_OVER_UNIFORM = 2.0  # a sink: baseline F-Attn >= 2x the uniform value
MASSIVE_RATIO = 100.0  # massive activations: baseline M-Act / median >= 100 (Sun et al.: 1e3-1e4 in LLMs)
NOISE_K = 2.0  # timing: the mean overhead must be this many standard errors from 0
MIN_TIMING_ROUNDS = 3
OVERHEAD_LIMIT = P.OVERHEAD  # the paper: the gate's wall-time cost stays under this share
SPARSE_GATE = 0.35  # sigmoid(0) = 0.5 at initialisation; sparse is well below it, as in the paper (0.12-0.34)


@dataclass(frozen=True)
class Verdict:
    status: str
    measured: str


@dataclass(frozen=True)
class Claim:
    """One claim: ``judge`` reads a study's results; ``needs`` names the variants it is
    judged on (a study that trained none of them leaves it out, where the registry says so)."""

    key: str
    source: str
    statement: str
    paper: str
    judge: Callable[[dict[str, Any]], Verdict]
    needs: tuple[str, ...] = ()


def _metric(results: dict, variant: str, metric: str) -> dict | None:
    summary = results.get("summary", {}).get(variant)
    if summary is None or metric not in summary:
        return None
    value = summary[metric]
    return value if value is not None and value.get("mean") is not None else None


def uniform_first_token_attention(n_after_bos: int) -> float:
    """F-Attn of uniform causal attention: query i (1..T) sees i + 1 keys, so
    ``(1/T)·Σ_{i=1..T} 1/(i+1)`` for T = ``n_after_bos`` positions after BOS."""
    if n_after_bos < 1:
        raise ValueError(f"n_after_bos must be >= 1, got {n_after_bos}")
    return math.fsum(1.0 / (i + 1) for i in range(1, n_after_bos + 1)) / n_after_bos


def _n_after_bos(results: dict) -> int | None:
    """Query positions after BOS in the analysed sequences: the model input is BOS plus
    ``seq_len - 1`` tokens (the last token of a ``[BOS] + seq_len`` row is only a target)."""
    seq_len = (results.get("config") or {}).get("seq_len")
    return seq_len - 1 if isinstance(seq_len, int) and seq_len >= 2 else None


def sink_shown(results: dict, variant: str = "baseline", metric: str = "f_attn") -> str | None:
    """None when ``variant`` shows a sink by the measure the claim is about; otherwise why a
    claim about removing it is not measurable. For an F-Attn claim (``f_attn`` averaged
    over layers, or ``f_attn_strongest`` at the baseline's strongest layer) the rule is
    that F-Attn >= SINK_OVER_UNIFORM x uniform; for the Sink^ε claim (``sink_eps``), that
    at least one head's mean attention on BOS passes ε (Sink^ε > 0). A sink at several
    times uniform spread over heads is a sink for the F-Attn claims even where no single
    head passes ε (docs/design.md, "Where claims are judged")."""
    n = _n_after_bos(results)
    value = _metric(results, variant, metric)
    if value is None or n is None:
        return f"`{variant}` {metric} or the sequence length was not measured"
    if metric == "sink_eps":
        if value["mean"] > 0:
            return None
        return f"no head of the {variant} passes ε (Sink^ε {_fmt(value)}, needs > 0)"
    uniform = uniform_first_token_attention(n)
    if value["mean"] >= SINK_OVER_UNIFORM * uniform:
        return None
    return (f"the {variant} shows no sink by this rule at this budget (F-Attn {_fmt(value)}, uniform {uniform:.3f}, "
            f"needs ≥ {SINK_OVER_UNIFORM:g}× uniform)")


def massive_shown(results: dict, variant: str = "baseline") -> str | None:
    """None when ``variant`` shows massive activations (M-Act / median >= MASSIVE_RATIO);
    otherwise why a claim about removing them is not measurable."""
    ratio = _metric(results, variant, "m_act_ratio")
    if ratio is None:
        return f"`{variant}` M-Act / median was not measured"
    if ratio["mean"] >= MASSIVE_RATIO:
        return None
    return (f"the {variant} shows no massive activations at this budget (M-Act / median {_fmt(ratio)}, "
            f"needs ≥ {MASSIVE_RATIO:g})")


def compare_metrics(results: dict, variant: str, higher: str, lower: str, *, label: str) -> Verdict:
    """Is ``variant``'s ``higher`` metric above its ``lower`` one (beyond seed noise where
    two or more seeds ran)?"""
    a, b = _metric(results, variant, higher), _metric(results, variant, lower)
    if a is None or b is None:
        return Verdict(NOT_MEASURABLE, f"`{variant}` {higher if a is None else lower} was not measured")
    text = f"{label}: {_fmt(a)} vs {_fmt(b)}"
    if not (math.isfinite(a["mean"]) and math.isfinite(b["mean"])) or a["mean"] == b["mean"]:
        return Verdict(NOT_MEASURABLE, text + "; no difference")
    noise = differs_beyond_noise(a["values"], b["values"])
    if noise is False:
        return Verdict(NOT_MEASURABLE, text + "; the difference is within seed noise")
    suffix = "" if noise else "; one seed, so seed noise is unknown"
    return Verdict(HELD if a["mean"] > b["mean"] else NOT_HELD, text + suffix)


def compare(results: dict, better: str, worse: str, metric: str, *, lower_is_better: bool = True,
            min_ratio: float | None = None, label: str | None = None) -> Verdict:
    """Does ``better`` beat ``worse`` on ``metric``? ``min_ratio`` asks for a factor
    (e.g. 0.5: ``better`` at most half of ``worse``) rather than any difference."""
    a, b = _metric(results, better, metric), _metric(results, worse, metric)
    label = label or metric
    if a is None or b is None:
        missing = better if a is None else worse
        return Verdict(NOT_MEASURABLE, f"`{missing}` was not part of this run")
    text = f"{label}: {worse} {_fmt(b)} vs {better} {_fmt(a)}"
    if not (math.isfinite(a["mean"]) and math.isfinite(b["mean"])):
        return Verdict(NOT_MEASURABLE, text + " (a run diverged)")
    if a["mean"] == b["mean"]:
        return Verdict(NOT_MEASURABLE, text + "; no difference")
    sign = 1 if lower_is_better else -1
    goes_right = sign * (a["mean"] - b["mean"]) < 0
    weak = False
    if min_ratio is not None and b["mean"] != 0:
        ratio = a["mean"] / b["mean"]
        text += f" (ratio {ratio:.2f})"
        weak = goes_right and not (ratio <= min_ratio if lower_is_better else ratio >= 1 / min_ratio)
    noise = differs_beyond_noise(a["values"], b["values"])
    if noise is False:
        return Verdict(NOT_MEASURABLE, text + "; the difference is within seed noise")
    suffix = "" if noise else "; one seed, so seed noise is unknown"
    if weak:
        return Verdict(NOT_MEASURABLE, text + f"; lower, but not by the {100 * (1 - min_ratio):.0f} % this claim needs" + suffix)
    return Verdict(HELD if goes_right else NOT_HELD, text + suffix)


def _needs_sink(judge: Callable[[dict], Verdict], metric: str = "f_attn") -> Callable[[dict], Verdict]:
    """Judge a sink-removal claim only where the baseline shows a sink (by ``metric``)."""
    def wrapped(results: dict) -> Verdict:
        why = sink_shown(results, metric=metric)
        return judge(results) if why is None else Verdict(NOT_MEASURABLE, why)

    return wrapped


def _needs_massive(judge: Callable[[dict], Verdict]) -> Callable[[dict], Verdict]:
    """Judge a massive-activation claim only where the baseline shows them."""
    def wrapped(results: dict) -> Verdict:
        why = massive_shown(results)
        return judge(results) if why is None else Verdict(NOT_MEASURABLE, why)

    return wrapped


def _gate_sparse(variant: str) -> Callable[[dict], Verdict]:
    def judge(results: dict) -> Verdict:
        m = _metric(results, variant, "gate_mean")
        if m is None:
            return Verdict(NOT_MEASURABLE, f"`{variant}` was not part of this run")
        low = _metric(results, variant, "gate_frac_below_0.01")
        text = f"mean gate score {_fmt(m)}" + (f", {100 * low['mean']:.1f} % of scores < 0.01" if low else "")
        return Verdict(HELD if m["mean"] < SPARSE_GATE else NOT_HELD, text)

    return judge


def _learnable_sink(results: dict) -> Verdict:
    """``sink`` against ``baseline``, else ``hyga-sink`` against ``hyga``."""
    for with_sink, without in (("sink", "baseline"), ("hyga-sink", "hyga")):
        if _metric(results, with_sink, "f_attn") and _metric(results, without, "f_attn"):
            return compare(results, with_sink, without, "f_attn", min_ratio=REDUCTION, label="F-Attn")
    return Verdict(NOT_MEASURABLE, "neither `sink` with `baseline` nor `hyga-sink` with `hyga` was run")


def _extrapolation(results: dict) -> Verdict:
    ext = results.get("summary", {})
    key = "ext_yarn_longest"
    a, b = _metric(results, "gated", key), _metric(results, "baseline", key)
    if a is None or b is None:
        return Verdict(NOT_MEASURABLE, "extrapolation was not measured for baseline and gated")
    verdict = compare(results, "gated", "baseline", key, label="val loss at the longest length with YaRN")
    length = ext.get("gated", {}).get("ext_longest_multiple")
    if length:
        verdict = Verdict(verdict.status, verdict.measured + f" ({length:g}x the training context)")
    return verdict


def _lr_study_outcome(rows: list[dict]) -> tuple[list[float], list[float], dict[str, int]]:
    """Learning rates at which baseline and gated diverged, and their loss spikes in all."""
    def diverged_at(variant: str) -> list[float]:
        return sorted({r["lr"] for r in rows if r["variant"] == variant and r.get("diverged")})

    spikes = {v: sum(r.get("spikes", 0) for r in rows if r["variant"] == v) for v in ("baseline", "gated")}
    return diverged_at("baseline"), diverged_at("gated"), spikes


def first_unstable_lr(rows: list[dict], variant: str) -> dict[str, float | None]:
    """The smallest learning rate at which ``variant`` had a loss spike, and at which it
    diverged (None: never on this ladder)."""
    mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["lr"])
    spike = next((r["lr"] for r in mine if r.get("spikes", 0) > 0 or r.get("diverged")), None)
    diverged = next((r["lr"] for r in mine if r.get("diverged")), None)
    return {"spike": spike, "diverged": diverged}


def _lr_text(lr: float | None) -> str:
    return "none" if lr is None else f"{lr:g}"


def _stability(results: dict) -> Verdict:
    study = results.get("lr_study")
    if not study:
        return Verdict(NOT_MEASURABLE, "the learning-rate study was not run (`gatedattn reproduce --study lr`)")
    rows = study.get("runs", [])
    base_div, gated_div, spikes = _lr_study_outcome(rows)
    first = {v: first_unstable_lr(rows, v) for v in ("baseline", "gated")}
    top = max((r["lr"] for r in rows), default=None)
    text = ("first loss spike at LR " + " vs ".join(f"{_lr_text(first[v]['spike'])} ({v})" for v in first)
            + "; first divergence at LR " + " vs ".join(f"{_lr_text(first[v]['diverged'])} ({v})" for v in first)
            + f"; loss spikes {spikes['baseline']} vs {spikes['gated']} over LRs up to {_lr_text(top)}")
    if base_div and (not gated_div or min(gated_div) > min(base_div)):
        return Verdict(HELD, text)
    if gated_div and (not base_div or min(gated_div) < min(base_div)):
        return Verdict(NOT_HELD, text)
    if _clearly_fewer(spikes["gated"], spikes["baseline"]):
        return Verdict(HELD, text + "; no divergence, clearly fewer spikes with the gate")
    if _clearly_fewer(spikes["baseline"], spikes["gated"]):
        return Verdict(NOT_HELD, text + "; no divergence, clearly more spikes with the gate")
    return Verdict(NOT_MEASURABLE, text + "; neither diverged differently at these learning rates, and the spike "
                                          f"counts differ by less than {SPIKE_FACTOR:g}x (or fewer than "
                                          f"{MIN_SPIKES} spikes)")


SPIKE_FACTOR = 2.0  # without divergence, spike counts decide only when one is at most half the other
MIN_SPIKES = 3  # ... and the larger count is at least this (one or two spikes are batch noise)


def _clearly_fewer(few: int, many: int) -> bool:
    return many >= MIN_SPIKES and few * SPIKE_FACTOR <= many


def _overhead(results: dict) -> Verdict:
    """Gate wall-time overhead from interleaved rounds: per round ``gated / baseline - 1``;
    judged on their mean m and standard error se. |m| <= NOISE_K·se is within noise; a
    gated step faster beyond noise is a measurement artefact (the gate only adds work):
    both are *not measurable*. Otherwise held when m + NOISE_K·se < 2 %, did not hold when
    m - NOISE_K·se > 2 %, else not measurable (too close to the limit)."""
    samples = results.get("step_time_samples") or {}
    a, b = samples.get("gated"), samples.get("baseline")
    if not a or not b:
        return Verdict(NOT_MEASURABLE, "baseline and gated were not timed in repeated interleaved rounds")
    rounds = min(len(a), len(b))
    if rounds < MIN_TIMING_ROUNDS:
        return Verdict(NOT_MEASURABLE, f"{rounds} timing round(s); at least {MIN_TIMING_ROUNDS} are needed for a noise estimate")
    m, se = _mean_se([ga / ba - 1 for ga, ba in zip(a[:rounds], b[:rounds])])
    med_a, med_b = sorted(a)[len(a) // 2], sorted(b)[len(b) // 2]
    text = (f"training step {1000 * med_b:.1f} ms (baseline) vs {1000 * med_a:.1f} ms (gated), medians of {rounds} "
            f"interleaved rounds: overhead {100 * m:+.1f} % ± {100 * se:.1f} % (standard error)")
    return _judge_overhead(m, se, text)


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (two or more values)."""
    n = len(values)
    m = math.fsum(values) / n
    return m, math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1) / n)


def _judge_overhead(m: float, se: float, text: str) -> Verdict:
    """The overhead rule of ``_overhead`` on a mean ``m`` and standard error ``se``."""
    if abs(m) <= NOISE_K * se:
        return Verdict(NOT_MEASURABLE, text + "; within timing noise")
    if m < 0:
        return Verdict(NOT_MEASURABLE, text + "; the gated step measured faster, which is timing noise, not a saving")
    if m + NOISE_K * se < OVERHEAD_LIMIT:
        return Verdict(HELD, text)
    if m - NOISE_K * se > OVERHEAD_LIMIT:
        return Verdict(NOT_HELD, text + " (a small CPU model, where the gate is a larger share of the FLOPs than at paper scale)")
    return Verdict(NOT_MEASURABLE, text + f"; too close to {100 * OVERHEAD_LIMIT:g} % to tell")


SWEPT, REFERENCE = "hyga-lowrank", "gated"  # the rank sweep's swept variant and its full-rank reference


def mean_rows(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per sweep point: val loss averaged over seeds."""
    merged: dict[tuple, dict[str, Any]] = {}
    for r in sweep["rows"]:
        key = (r["variant"], r["d_int"])
        m = merged.setdefault(key, {**r, "losses": []})
        m["losses"].append(r["val_loss"])
    for m in merged.values():
        m["val_loss"] = sum(m["losses"]) / len(m["losses"])
    return list(merged.values())


def lowrank_outcome(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """Per d_int: gate FLOPs as a share of G1's and the val-loss difference to it."""
    rows = mean_rows(sweep)
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    if ref is None:
        return []
    return [{"d_int": r["d_int"], "share": r["gate_flops"] / ref["gate_flops"], "delta": r["val_loss"] - ref["val_loss"],
             "loss": r["val_loss"], "ref_loss": ref["val_loss"], "seeds": len(r["losses"])}
            for r in rows if r["variant"] == SWEPT]


LOWRANK_SHARE = 0.35  # "a fraction of the G1 gate": the paper's d_int 32 costs 26 %


def _gated_seed_losses(results: dict, sweep: dict) -> list[float]:
    """Final val losses of `gated` over seeds at the sweep's step count: the sweep's own
    reference runs, or the main runs' when they trained as many steps and more seeds."""
    own = [x["val_loss"] for x in sweep["rows"] if x["variant"] == "gated"]
    main = _metric(results, "gated", "val_loss")
    same_steps = (results.get("config") or {}).get("steps") == sweep.get("steps")
    if main and same_steps and len(main["values"]) > len(own):
        return list(main["values"])
    return own


def _lowrank_sweep(results: dict, sweep: dict) -> Verdict:
    """From the rank sweep: the cheapest d_int whose gate costs at most LOWRANK_SHARE of
    G1's; held when its loss is no worse than gated's (within the gated runs' seed noise
    where several seeds ran)."""

    rows = lowrank_outcome(sweep)
    if not rows:
        return Verdict(NOT_MEASURABLE, "the rank sweep has no `gated` reference run")
    cheap = [r for r in rows if r["share"] <= LOWRANK_SHARE and math.isfinite(r["loss"])]
    table = "; ".join(f"d_int {r['d_int']}: {100 * r['share']:.0f} % of G1's gate FLOPs, Δ val loss {r['delta']:+.4f}"
                      for r in rows)
    ref_losses = _gated_seed_losses(results, sweep)
    noise = 2 * statistics.stdev(ref_losses) if len(ref_losses) >= 2 else 0.0
    suffix = (f"; `gated` seed noise (2σ over {len(ref_losses)} seeds) {noise:.4f}" if len(ref_losses) >= 2
              else "; one seed, so seed noise is unknown")
    if not cheap:
        return Verdict(NOT_MEASURABLE, f"{table}; no d_int costs ≤ {100 * LOWRANK_SHARE:.0f} % of G1's gate" + suffix)
    best = min(cheap, key=lambda r: r["delta"])
    if best["delta"] <= noise:
        return Verdict(HELD, f"{table}; d_int {best['d_int']} matches or beats G1 at {100 * best['share']:.0f} % of "
                             f"its gate cost" + suffix)
    return Verdict(NOT_HELD, f"{table}; every d_int at ≤ {100 * LOWRANK_SHARE:.0f} % of G1's cost loses to it" + suffix)


def _lowrank_cost(results: dict) -> Verdict:
    if results.get("rank_sweep"):
        return _lowrank_sweep(results, results["rank_sweep"])
    cost = results.get("gate_cost", {})
    full, low = cost.get("gated"), cost.get("hyga-lowrank")
    if not full or not low:
        return Verdict(NOT_MEASURABLE, "gate costs were not computed")
    share = low["gate_flops"] / full["gate_flops"]
    text = f"gate FLOPs of hyga-lowrank (d_int 16) = {100 * share:.0f} % of G1 elementwise at this model's head size"
    loss = compare(results, "hyga-lowrank", "gated", "val_loss", label="val loss")
    if loss.status == NOT_MEASURABLE:
        return Verdict(NOT_MEASURABLE, f"{text}; {loss.measured}")
    if share > LOWRANK_SHARE:
        return Verdict(NOT_HELD, f"{text}; {loss.measured}")
    return Verdict(loss.status, f"{text}; {loss.measured}")


_FATTN = f"F-Attn {P.F_ATTN['baseline']} → {P.F_ATTN['gated']}"
CLAIMS: list[Claim] = [
    Claim("ga-loss", "Gated Attention", "A G1 elementwise sigmoid gate lowers the loss",
          f"PPL {P.PPL['baseline']} → {P.PPL['gated']} ({P.PPL_MODEL})", lambda r: compare(r, "gated", "baseline", "val_loss", label="val loss")),
    Claim("ga-sink", "Gated Attention", "The gate removes the attention sink (F-Attn)",
          _FATTN, _needs_sink(lambda r: compare(r, "gated", "baseline", "f_attn", min_ratio=REDUCTION, label="F-Attn"))),
    Claim("ga-sink-layer", "Gated Attention", "The gate removes the sink where it is strongest (F-Attn of the "
          "baseline's strongest layer)", _FATTN + " (averaged)",
          _needs_sink(lambda r: compare(r, "gated", "baseline", "f_attn_strongest", min_ratio=REDUCTION,
                                        label=f"F-Attn at layer {r.get('strongest_layer', '?')}"),
                      metric="f_attn_strongest")),
    Claim("ga-sink-eps", "Gated Attention", "Fewer sink heads (Sink^ε, ε = 0.3)",
          "follows from F-Attn", _needs_sink(lambda r: compare(r, "gated", "baseline", "sink_eps", label="Sink^ε"), metric="sink_eps")),
    Claim("ga-mact", "Gated Attention", "The gate removes massive activations (M-Act)",
          f"M-Act {P.M_ACT['baseline']} → {P.M_ACT['gated']}", _needs_massive(lambda r: compare(r, "gated", "baseline", "m_act", min_ratio=REDUCTION, label="M-Act"))),
    Claim("ga-sparse", "Gated Attention", "Gate scores are sparse (mostly near 0)",
          f"mean score {P.GATE_SCORE_MEAN}", _gate_sparse("gated")),
    Claim("ga-headwise-mact", "Gated Attention", "A headwise gate also removes massive activations",
          f"M-Act {P.M_ACT['baseline']} → {P.M_ACT['gated-headwise']}", _needs_massive(lambda r: compare(r, "gated-headwise", "baseline", "m_act", min_ratio=REDUCTION, label="M-Act"))),
    Claim("ga-headwise", "Gated Attention", "A headwise gate also removes the sink",
          f"F-Attn {P.F_ATTN['gated-headwise']}, M-Act {P.M_ACT['gated-headwise']}", _needs_sink(lambda r: compare(r, "gated-headwise", "baseline", "f_attn", min_ratio=REDUCTION, label="F-Attn"))),
    Claim("ga-extrapolation", "Gated Attention", "Gated models extrapolate better with YaRN",
          f"RULER at 128k: {P.RULER_128K['baseline']} → {P.RULER_128K['gated']}", _extrapolation),
    Claim("ga-stability", "Gated Attention", "Gating keeps training stable at a high learning rate",
          f"baseline diverges at LR {P.UNSTABLE_LR:.0e}, gated trains".replace("e-0", "e-"), _stability),
    Claim("ga-overhead", "Gated Attention", f"The gate costs under {100 * P.OVERHEAD:g} % wall time",
          f"< {100 * P.OVERHEAD:g} % (paper scale)", _overhead),
    Claim("hyga-loss", "HyGA", "HyGA reaches a lower loss than gated attention",
          f"+{P.HYGA_OVER_GATED} avg score over gated", lambda r: compare(r, "hyga-lowrank", "gated", "val_loss", label="val loss")
          if _metric(r, "hyga", "val_loss") is None else compare(r, "hyga", "gated", "val_loss", label="val loss")),
    Claim("hyga-lowrank", "HyGA", "Low-rank HyGA costs a fraction of the G1 gate with no loss penalty",
          f"d_int {P.HYGA_LOWRANK[0]}: {100 * P.HYGA_LOWRANK[1]:.0f} % of gate compute, slightly better loss", _lowrank_cost),
    Claim("hyga-sink", "HyGA", "A learnable sink takes the sink's role off the first token",
          f"+{P.HYGA_SINK_GAIN} avg score (ablation)", _needs_sink(_learnable_sink)),
]


def judge_all(results: dict) -> list[dict[str, str]]:
    """One row per claim: source, statement, paper figure, verdict, what was measured."""
    rows = []
    for claim in CLAIMS:
        verdict = claim.judge(results)
        rows.append({"key": claim.key, "source": claim.source, "claim": claim.statement,
                     "paper": claim.paper, "verdict": verdict.status, "measured": verdict.measured})
    return rows
