"""The mechanism study's claims: what the papers say about the sink on
Bigram-Backcopy, each with its rule, judged per depth from the summaries."""

from __future__ import annotations

from typing import Callable

from gatedattn import paper as P
from gatedattn.infra.fmt import fmt_mean_std as _fmt
from gatedattn.reproduce.mechanism.config import GATED
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.verdicts import (
    HELD, NOT_HELD, NOT_MEASURABLE, Claim, Verdict, at_least, below, compare, compare_metrics,
    uniform_first_token_attention,
)

SINK_SHARE = 0.5  # the sink the task is known for: at least half of an ordinary position's attention
REMOVAL_RATIO = 0.5  # "removes": at most half of the baseline's BOS attention


def _uniform(results: dict) -> float:
    level = results["summary"]["baseline"].get("uniform_bos_attn_ordinary")
    return level["mean"] if level else uniform_first_token_attention(results["config"]["seq_len"] - 1)


def _sink_forms(results: dict) -> Verdict:
    m = results.get("summary", {}).get("baseline", {}).get("bos_attn_ordinary")
    if not m:
        return Verdict(NOT_MEASURABLE, "`baseline` was not part of this run")
    uniform = _uniform(results)
    trig = results["summary"]["baseline"].get("bos_attn_trigger")
    text = (f"BOS attention of ordinary positions {_fmt(m)} = {m['mean'] / uniform:.1f}× the uniform level "
            f"({uniform:.3f})" + (f"; trigger positions {_fmt(trig)}" if trig else ""))
    seeds = m.get("values") or [m["mean"]]
    return at_least({"values": seeds}, SINK_SHARE, text + f"; seeds {', '.join(f'{x:.3f}' for x in seeds)} against "
                                                          f"the {SINK_SHARE:g} the task is known for")

SINKING = 3.0  # a sink to remove: the baseline's BOS attention from ordinary positions >= 3x uniform
DRAIN = 0.5  # value-state drain: ‖v_BOS‖ <= 0.5 x the other tokens'
PEAK = 2.0  # residual-state peak: ‖h_BOS‖ >= 2 x the other tokens'


def mechanism_sink_shown(results: dict) -> str | None:
    """None when the baseline's BOS attention from ordinary positions is at least SINKING x
    the uniform level (the quantity the removal claims are about); else why not."""
    m = results.get("summary", {}).get("baseline", {}).get("bos_attn_ordinary")
    if not m:
        return "`baseline` was not measured"
    uniform = _uniform(results)
    if m["mean"] >= SINKING * uniform:
        return None
    return (f"the baseline shows no sink to remove (BOS attention of ordinary positions {_fmt(m)}, needs ≥ "
            f"{SINKING:g}× uniform = {SINKING * uniform:.3f})")


def _norm_ratio(results: dict, variant: str, kind: str) -> tuple[float, list[float]] | None:
    """Seed-mean and per-seed ‖x_BOS‖ / ‖x_other‖ of ``kind`` (value or resid)."""
    m = results.get("summary", {}).get(variant, {})
    bos, other = m.get(f"{kind}_norm_bos"), m.get(f"{kind}_norm_other")
    if not bos or not other:
        return None
    per_seed = [b / o for b, o in zip(bos["values"], other["values"]) if o]
    return (sum(per_seed) / len(per_seed), per_seed) if per_seed else None


def _norm_claim(kind: str, variant: str | None):
    """The baseline's drain (value) or peak (resid); with ``variant``, whether it vanishes there."""
    label = {"value": ("value-state drain", "‖v_BOS‖ / ‖v_other‖"), "resid": ("residual-state peak",
                                                                             "‖h_BOS‖ / ‖h_other‖")}[kind]

    limit = DRAIN if kind == "value" else PEAK
    shows, vanishes = (below, at_least) if kind == "value" else (at_least, below)

    def judge(results: dict) -> Verdict:
        base = _norm_ratio(results, "baseline", kind)
        if base is None:
            return Verdict(NOT_MEASURABLE, f"{label[1]} was not measured")
        text = f"baseline {label[1]} {base[0]:.2f} (seeds {', '.join(f'{x:.2f}' for x in base[1])})"
        shown = shows({"values": base[1]}, limit, text)
        if variant is None:
            return shown
        if shown.status != HELD:
            return Verdict(NOT_MEASURABLE, text + f": the baseline shows no {label[0]} beyond seed noise")
        other = _norm_ratio(results, variant, kind)
        if other is None:
            return Verdict(NOT_MEASURABLE, f"`{variant}` {label[1]} was not measured")
        text += f"; `{variant}` {other[0]:.2f} (seeds {', '.join(f'{x:.2f}' for x in other[1])})"
        return vanishes({"values": other[1]}, limit, text)

    return judge


def _removes(variant: str, than: str = "baseline", min_ratio: float | None = REMOVAL_RATIO):
    """``variant`` leaves less BOS attention from ordinary positions than ``than`` (by the
    factor ``min_ratio``, or beyond seed noise where None); judged where the baseline sinks."""
    def judge(results: dict) -> Verdict:
        shown = mechanism_sink_shown(results)
        if shown is not None:
            return Verdict(NOT_MEASURABLE, shown)
        return compare(results, variant, than, "bos_attn_ordinary", min_ratio=min_ratio,
                       label="BOS attention of ordinary positions")

    return judge


def _selective(variant: str):
    def judge(results: dict) -> Verdict:
        verdict = compare_metrics(results, variant, "gate_trigger", "gate_ordinary",
                                  label=f"`{variant}` gate score, trigger vs ordinary positions")
        m = results.get("summary", {}).get(variant, {})
        if verdict.status == HELD and m["gate_ordinary"]["mean"] > 0.5 * m["gate_trigger"]["mean"]:
            return Verdict(NOT_HELD, verdict.measured + "; higher on triggers, but not closed elsewhere "
                                                        "(ordinary above half the trigger score)")
        return verdict

    return judge


def _seeds(stat: dict) -> list[float]:
    return stat.get("values") or [stat["mean"]]


def _per_seed(values: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in values)


def _sink_takes_the_role(variant: str):
    """The learnable sink of ``variant`` takes the sink's role where it holds at least half
    of the baseline's BOS attention (same seed) from ordinary positions and BOS keeps at
    most REMOVAL_RATIO of it, each beyond seed noise (mean ∓ 2·std of the per-seed shares);
    a line within that noise is not measurable. Judged from the sink's share
    itself, so a sink that takes no mass fails the claim even where BOS attention stays
    within seed noise of the baseline's."""

    def judge(results: dict) -> Verdict:
        shown = mechanism_sink_shown(results)
        if shown is not None:
            return Verdict(NOT_MEASURABLE, shown)
        summary = results["summary"]
        mass = summary.get(variant, {}).get("sink_mass_ordinary")
        bos = summary.get(variant, {}).get("bos_attn_ordinary")
        if not mass or not bos:
            return Verdict(NOT_MEASURABLE, f"`{variant}`'s learnable sink was not measured")
        base = summary["baseline"]["bos_attn_ordinary"]
        masses, left, reference = _seeds(mass), _seeds(bos), _seeds(base)
        if len(reference) != len(masses):  # unpaired seeds: against the baseline's mean
            reference = [base["mean"]] * len(masses)
        text = (f"`{variant}`: the sink's share of ordinary positions' attention {_fmt(mass)} (seeds "
                f"{_per_seed(masses)}), BOS attention left {_fmt(bos)} (seeds {_per_seed(left)}); the baseline's "
                f"BOS attention {_fmt(base)} (seeds {_per_seed(_seeds(base))})")
        takes = at_least({"values": [m / r for m, r in zip(masses, reference)]}, 0.5, "")
        leaves = below({"values": [b / r for b, r in zip(left, reference)]}, REMOVAL_RATIO, "")
        if takes.status == HELD and leaves.status == HELD:
            return Verdict(HELD, text)
        why = []
        if takes.status != HELD:
            why.append("the sink takes under half the baseline's BOS attention" if takes.status == NOT_HELD else
                       "half the baseline's BOS attention lies within seed noise of the sink's share")
        if leaves.status != HELD:
            why.append(f"BOS keeps over {REMOVAL_RATIO:g}× the baseline's" if leaves.status == NOT_HELD else
                       f"{REMOVAL_RATIO:g}× the baseline's BOS attention lies within seed noise of what BOS keeps")
        status = NOT_HELD if NOT_HELD in (takes.status, leaves.status) else NOT_MEASURABLE
        return Verdict(status, text + "; " + "; ".join(why))

    return judge


# (key, claim, variants it needs, judge)
SOURCE = "Bigram-Backcopy"  # the mechanism claims' source: the task of Guo et al. 2024 built to show the sink


def _claim(key: str, statement: str, paper: str, needs: tuple[str, ...],
           judge: Callable[[dict], Verdict]) -> Claim:
    return Claim(key, SOURCE, statement, paper, judge, needs)


# what the papers say about each variant's effect on the sink (paper.py's words)
REMOVAL_TEXT = {"gated": P.GA_REMOVES_SINK, "gated-headwise": P.GA_HEADWISE_SINK, "hyga": P.HYGA_SINK_LEFT,
                "hyga-lowrank": P.HYGA_SINK_LEFT, "hyga-sink": P.HYGA_SINK_LEFT, "hyga-h": P.HYGA_H_GATE,
                "hyga-c": P.HYGA_C_GATE}
HYGA_FULL = ("hyga", "hyga-lowrank", "hyga-sink")  # the variants with HyGA's X-gate, H-gate and C-gate



MECHANISM_CLAIMS: list[Claim] = [
    _claim("mech-sink", "The baseline's ordinary positions attend to BOS (≥ 0.5 of their attention)", P.GUO_SINK,
           ("baseline",), _sink_forms),
    _claim("mech-drain", f"The baseline's BOS value vector drains (‖v_BOS‖ ≤ {DRAIN:g}× the others', beyond seed noise)",
           P.GUO_DRAIN, ("baseline",), _norm_claim("value", None)),
    _claim("mech-peak", f"The baseline's BOS residual state peaks (‖h_BOS‖ ≥ {PEAK:g}× the others', beyond seed noise)",
           P.GUO_PEAK, ("baseline",), _norm_claim("resid", None)),
    *[_claim(f"mech-drain-{v}", f"The value-state drain vanishes with `{v}`", P.GA_REMOVES_SINK, ("baseline", v),
             _norm_claim("value", v)) for v in ("gated",)],
    *[_claim(f"mech-peak-{v}", f"The residual-state peak vanishes with `{v}`", P.GA_REMOVES_MACT, ("baseline", v),
             _norm_claim("resid", v)) for v in ("gated",)],
    *[_claim(f"mech-removes-{v}", f"`{v}` removes the sink (≤ 0.5× the baseline's BOS attention)", REMOVAL_TEXT[v],
             ("baseline", v), _removes(v)) for v in GATED],
    *[_claim(f"mech-below-gated-{v}", f"`{v}` leaves less of the sink than `gated` (BOS attention)", P.HYGA_SINK_LEFT,
             ("baseline", "gated", v), _removes(v, than="gated", min_ratio=None)) for v in HYGA_FULL],
    *[_claim(f"mech-selective-{v}", f"`{v}`'s gate opens on triggers and closes elsewhere", P.GA_SPARSE, (v,),
             _selective(v)) for v in GATED],
    _claim("mech-learnable-sink", "The learnable sink takes the sink's role (`sink`)", P.LEARNABLE_SINK,
           ("baseline", "sink"), _sink_takes_the_role("sink")),
    _claim("mech-learnable-sink-hyga", "HyGA's learnable sink takes the sink's role (`hyga-sink`)", P.LEARNABLE_SINK,
           ("baseline", "hyga-sink"), _sink_takes_the_role("hyga-sink")),
]


def judge_mechanism(results: dict) -> list[dict[str, str]]:
    """One row per claim whose variants ran: key, claim, verdict, what was measured."""
    present = set(results.get("summary", {}))
    rows = []
    for claim in MECHANISM_CLAIMS:
        if not set(claim.needs) <= present:
            continue
        verdict = claim.judge(results)
        rows.append({"key": claim.key, "claim": claim.statement, "paper": claim.paper, "verdict": verdict.status,
                     "measured": verdict.measured})
    return rows


def judge_depths(results: MechanismResults) -> MechanismResults:
    """A mechanism study's ``results`` with each depth's claims judged anew by the
    current rules (a report written again from results.json)."""
    view = {"seq_len": results.config["seq_len"]}
    return results.replace(depths={depth: {**block, "claims": judge_mechanism({"summary": block["summary"],
                                                                                "config": view})}
                                   for depth, block in results.depths.items()})
