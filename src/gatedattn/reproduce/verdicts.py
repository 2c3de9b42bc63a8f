"""Verdicts on the papers' claims: the rules every study's claims share.

A claim reads a study's ``results`` (for the natural-text studies
``results["summary"][variant][metric]`` holds ``{"mean", "std", "values"}`` over seeds) and
returns a ``Verdict``:

- ``held``: the measured difference goes the paper's way (and, with two or more seeds,
  is larger than the seed noise: |Δmean| > 2·sqrt(std_a² + std_b²));
- ``did not hold``: it goes the other way, beyond noise where noise is known;
- ``not measurable``: within seed noise, the needed variant or study was not run, or
  the effect the claim needs did not form at this budget.

A claim that a metric stays under a line (:func:`below`) or reaches one (:func:`at_least`)
holds when the whole band mean ± 2·std over the seeds is on the claim's side, fails when
it is all on the other, and is not measurable when the line lies within that noise; a
claim that one variant is a factor below another (``compare(..., min_ratio=)``) holds only
where the factor, not just the ratio of the means, is beyond the seeds' noise. A figure at
its line's edge would otherwise read one way here and the other on the next seed, text or
CPU.

A claim about *removing* a phenomenon is judged only where the baseline shows it:

- the sink: baseline F-Attn at least ``SINK_OVER_UNIFORM`` times the uniform value
  (uniform causal attention over T positions after BOS gives ``(1/T)·Σ_{i=1..T} 1/(i+1)``)
  and Sink^ε > 0 (:func:`sink_shown`);
- massive activations: baseline M-Act / median at least ``MASSIVE_RATIO``
  (:func:`massive_shown`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from gatedattn.analysis.metrics import differs_beyond_noise, mean_std
from gatedattn.infra.fmt import fmt_mean_std as _fmt


HELD, NOT_HELD, NOT_MEASURABLE = "held", "did not hold", "not measurable"


# Sink and massive-activation claims need the gated value at most this share of the
# baseline's (the paper reports 10x; a small run must at least show a clear reduction).
REDUCTION = 0.75


SINK_OVER_UNIFORM = 2.0  # a sink: baseline F-Attn >= 2x the uniform value


MASSIVE_RATIO = 100.0  # massive activations: baseline M-Act / median >= 100 (Sun et al.: 1e3-1e4 in LLMs)


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


def summary_metric(results: dict, variant: str, metric: str) -> dict | None:
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
    value = summary_metric(results, variant, metric)
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
    ratio = summary_metric(results, variant, "m_act_ratio")
    if ratio is None:
        return f"`{variant}` M-Act / median was not measured"
    if ratio["mean"] >= MASSIVE_RATIO:
        return None
    return (f"the {variant} shows no massive activations at this budget (M-Act / median {_fmt(ratio)}, "
            f"needs ≥ {MASSIVE_RATIO:g})")


def compare_metrics(results: dict, variant: str, higher: str, lower: str, *, label: str) -> Verdict:
    """Is ``variant``'s ``higher`` metric above its ``lower`` one (beyond seed noise where
    two or more seeds ran)?"""
    a, b = summary_metric(results, variant, higher), summary_metric(results, variant, lower)
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


def _line(values: list[float], limit: float, text: str, k: float, above: bool) -> Verdict:
    """Is a metric over seeds on its side of ``limit`` (at or above it where ``above``, under
    it otherwise), beyond seed noise where two or more seeds ran? ``held`` when the whole
    band mean ± k·std is on that side, ``did not hold`` when it is all on the other, ``not
    measurable`` when the line lies inside it: a figure that close to its line could read
    either way on the next seed, text or CPU."""
    mean, std = mean_std(values)
    if not math.isfinite(mean):
        return Verdict(NOT_MEASURABLE, text + " (a run diverged)")
    side = (lambda v: v >= limit) if above else (lambda v: v < limit)
    if len(values) < 2 or not math.isfinite(std):
        return Verdict(HELD if side(mean) else NOT_HELD, text + "; one seed, so seed noise is unknown")
    low, high = mean - k * std, mean + k * std
    if side(low) and side(high):
        return Verdict(HELD, text)
    if not side(low) and not side(high):
        return Verdict(NOT_HELD, text)
    return Verdict(NOT_MEASURABLE, text + f"; {limit:g} lies within seed noise of the mean")


def below(stat: dict, limit: float, text: str, k: float = 2.0) -> Verdict:
    """Is a metric over seeds (``{"mean", "values"}``) under ``limit``, beyond seed noise where
    two or more seeds ran? ``held`` when mean + k·std < limit, ``did not hold`` when
    mean − k·std >= limit, else ``not measurable`` (the line lies within the seeds' noise)."""
    return _line(stat.get("values") or [stat["mean"]], limit, text, k, above=False)


def at_least(stat: dict, limit: float, text: str, k: float = 2.0) -> Verdict:
    """Is a metric over seeds at or above ``limit``, beyond seed noise where two or more seeds
    ran? ``held`` when mean − k·std >= limit, ``did not hold`` when mean + k·std < limit,
    else ``not measurable``."""
    return _line(stat.get("values") or [stat["mean"]], limit, text, k, above=True)


def factor_beyond_noise(a: list[float], b: list[float], ratio: float, k: float = 2.0) -> bool | None:
    """Whether ``mean(a)`` is below ``ratio · mean(b)`` by more than seed noise: the gap
    ``mean(a) − ratio·mean(b)`` against k·√(std_a² + ratio²·std_b²). None where fewer than two
    seeds ran on either side or a figure is not finite."""
    scaled = [ratio * v for v in b]
    beyond = differs_beyond_noise(a, scaled, k)  # the difference rule, on ratio · b
    return beyond and mean_std(a)[0] < mean_std(scaled)[0] if beyond is not None else None


def _short_of_factor(a: dict, b: dict, min_ratio: float, lower_is_better: bool, noise: bool | None) -> str | None:
    """Why a difference that goes the claim's way does not reach the factor ``min_ratio``
    (``a`` the better variant's figure, ``b`` the worse one's), None where it does: the ratio
    of the means short of it, or, with seed noise known (``noise``), the factor itself within
    that noise."""
    ratio = a["mean"] / b["mean"]
    need = f"the {100 * (1 - min_ratio):.0f} % this claim needs"
    if not (ratio <= min_ratio if lower_is_better else ratio >= 1 / min_ratio):
        return f"lower, but not by {need}"
    small, large = (a["values"], b["values"]) if lower_is_better else (b["values"], a["values"])
    if noise and not factor_beyond_noise(small, large, min_ratio):
        return f"{need} lies within seed noise"
    return None


def compare(results: dict, better: str, worse: str, metric: str, *, lower_is_better: bool = True,
            min_ratio: float | None = None, label: str | None = None) -> Verdict:
    """Does ``better`` beat ``worse`` on ``metric``? ``min_ratio`` asks for a factor
    (e.g. 0.5: ``better`` at most half of ``worse``, beyond seed noise) rather than any
    difference."""
    a, b = summary_metric(results, better, metric), summary_metric(results, worse, metric)
    label = label or metric
    if a is None or b is None:
        missing = better if a is None else worse
        return Verdict(NOT_MEASURABLE, f"`{missing}` was not part of this run")
    text = f"{label}: {worse} {_fmt(b)} vs {better} {_fmt(a)}"
    if not (math.isfinite(a["mean"]) and math.isfinite(b["mean"])):
        return Verdict(NOT_MEASURABLE, text + " (a run diverged)")
    if a["mean"] == b["mean"]:
        return Verdict(NOT_MEASURABLE, text + "; no difference")
    goes_right = (a["mean"] < b["mean"]) == lower_is_better
    factored = min_ratio is not None and b["mean"] != 0
    if factored:
        text += f" (ratio {a['mean'] / b['mean']:.2f})"
    noise = differs_beyond_noise(a["values"], b["values"])
    if noise is False:
        return Verdict(NOT_MEASURABLE, text + "; the difference is within seed noise")
    suffix = "" if noise else "; one seed, so seed noise is unknown"
    short = _short_of_factor(a, b, min_ratio, lower_is_better, noise) if factored and goes_right else None
    if short:
        return Verdict(NOT_MEASURABLE, text + "; " + short + suffix)
    return Verdict(HELD if goes_right else NOT_HELD, text + suffix)
