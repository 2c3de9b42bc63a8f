"""The real-model study's claims, each judged on what the study measured.

Rules (the thresholds are named constants below):

- the sink and massive activations are *held* where the model shows them by the rules
  the whole project uses (F-Attn ≥ 2× uniform and Sink^ε > 0; M-Act / median ≥ 100);
- the no-op: under window attention dropping the first token must cost at least
  ``MIN_GAP_SE`` standard errors (over held-out windows); in full attention it must cost
  at most ``NOOP_SHARE`` of that;
- an arm's recovery is what it is *credited* with: min(paired, unpaired), and 0 where its
  held-out kept-mode loss rose by more than the study's ``kept_tol`` (paired: first token
  dropped vs kept, same batches; unpaired: against the untouched model). An arm *takes
  the first token's role* when its credited recovery is at least ``RECOVERS`` beyond seed
  noise (mean − 2·std over the data orders) and beyond the control's (|Δmean| >
  2·√(σ₁² + σ₂²)); *did not hold* below ``RECOVERS`` beyond noise (mean + 2·std), or where
  the control is beyond it; *not measurable* where ``RECOVERS`` lies within the orders'
  noise, the arm is within noise of the control, or no window needed the first token (the
  control's own claim, under ``RECOVERS``, by the same band);
- streaming holds where the perplexity with the trained sink is within ``STREAM_RATIO``
  of the perplexity with the first token kept, past the first window;
- the per-head claims need a Pearson r of at least ``HEAD_R`` (sink probability rising,
  gate score falling, with the untouched model's first-token attention per head), beyond
  the data orders' noise by the same band; a line inside the band is *not measurable*.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gatedattn.analysis.metrics import differs_beyond_noise
from gatedattn.reproduce.verdicts import (
    HELD, MASSIVE_RATIO, NOT_HELD, NOT_MEASURABLE, REDUCTION, SINK_OVER_UNIFORM, Verdict, at_least, below,
    uniform_first_token_attention,
)

RECOVERS = 0.5  # an arm must close at least half of the first token's loss gap, beyond the orders' noise
HEAD_R = 0.5  # per-head correlation a "lands on the sink heads" claim needs
NOOP_SHARE = 0.1  # full attention may lose at most this share of the window's gap
MIN_GAP_SE = 4.0  # the window's gap must be this many standard errors
STREAM_RATIO = 1.02  # streaming: perplexity with the trained sink over perplexity with the first token kept


def _window_point(r: dict) -> dict | None:
    return next((p for p in r.get("noop", []) if r.get("window") and p["window"] == r["window"]), None)


def _full_point(r: dict) -> dict | None:
    return next((p for p in r.get("noop", []) if p["window"] == 0), None)


def _sink_present(r: dict) -> Verdict:
    s = r["sink"]
    uniform = uniform_first_token_attention(s["seq_len"] - 1)
    text = (f"F-Attn {s['f_attn']:.3f} ({s['f_attn'] / uniform:.0f}× uniform {uniform:.3f}), Sink^ε "
            f"{s['sink_eps']:.2f}")
    ok = s["f_attn"] >= SINK_OVER_UNIFORM * uniform and s["sink_eps"] > 0
    return Verdict(HELD if ok else NOT_HELD, text)


def _massive(r: dict) -> Verdict:
    s = r["sink"]
    top = (s.get("m_act_channels") or {}).get("top") or [{}]
    where = (f" (channel {top[0].get('channel')}, position {top[0].get('position')}, layer {top[0].get('layer')})"
             if top[0] else "")
    ratio = s.get("m_act_ratio")
    text = f"M-Act {s['m_act']:.0f}, {ratio:.0f}× the median" + where
    return Verdict(HELD if ratio is not None and ratio >= MASSIVE_RATIO else NOT_HELD, text)


def _window_needs_first(r: dict) -> Verdict:
    p = _window_point(r)
    if p is None:
        return Verdict(NOT_MEASURABLE, r.get("window_why", "no window was chosen"))
    text = (f"W {p['window']}: loss {p['kept']:.3f} kept vs {p['dropped']:.3f} dropped, Δ {p['gap']:+.3f} ± "
            f"{p['gap_se']:.3f} nats")
    return Verdict(HELD if p["gap"] > MIN_GAP_SE * p["gap_se"] else NOT_HELD, text)


def _full_noop(r: dict) -> Verdict:
    full, p = _full_point(r), _window_point(r)
    if full is None or p is None or not p["gap"] > MIN_GAP_SE * p["gap_se"]:
        return Verdict(NOT_MEASURABLE, "no window needed the first token, so there is nothing to compare with")
    text = f"full attention Δ {full['gap']:+.4f} ± {full['gap_se']:.4f} nats vs W {p['window']} Δ {p['gap']:+.3f}"
    return Verdict(HELD if full["gap"] <= NOOP_SHARE * p["gap"] else NOT_HELD, text)


def _gap_shown(r: dict) -> str | None:
    """None where the arms' window needed the first token beyond noise; otherwise why a
    claim about taking its role cannot be judged."""
    p = _window_point(r)
    if p is None:
        return r.get("window_why", "no window was chosen")
    if not p["gap"] > MIN_GAP_SE * p["gap_se"]:
        return (f"at W {p['window']} dropping the first token cost {p['gap']:+.3f} ± {p['gap_se']:.3f} nats, within "
                f"{MIN_GAP_SE:g} standard errors: there is no role to take")
    return None


def _needs_gap(judge: Callable[[dict], Verdict]) -> Callable[[dict], Verdict]:
    def wrapped(r: dict) -> Verdict:
        why = _gap_shown(r)
        return judge(r) if why is None else Verdict(NOT_MEASURABLE, why)

    return wrapped


def _fmt_rec(rec: dict) -> str:
    vals = ", ".join(f"{v:.2f}" for v in rec["values"] if v is not None)
    spread = "" if rec["std"] is None else f" ± {rec['std']:.2f}"  # one order: no spread
    return f"{rec['mean']:.2f}{spread} ({vals})"


def credit(arm: dict) -> dict:
    """The recovery an arm is judged by: its credited figure (results before the credit rule
    hold only the paired one)."""
    return arm.get("credited") or arm["recovered"]


def _takes_role(arm: str) -> Callable[[dict], Verdict]:
    def judge(r: dict) -> Verdict:
        p, arms = _window_point(r), r.get("arms", {})
        if arm not in arms:
            return Verdict(NOT_MEASURABLE, f"`{arm}` was not trained")
        rec = credit(arms[arm])
        vals = [v for v in rec["values"] if v is not None]
        text = f"credited {_fmt_rec(rec)} of Δ {p['gap']:.3f} nats ({len(vals)} data orders)"
        control = credit(arms["control"]) if "control" in arms else None
        if control is not None and arm != "control":
            text += f"; control {_fmt_rec(control)}"
        if not vals:
            return Verdict(NOT_MEASURABLE, text)
        line = at_least({"values": vals}, RECOVERS, text)
        if control is not None and arm != "control":
            beyond = differs_beyond_noise(vals, [v for v in control["values"] if v is not None])
            if beyond and rec["mean"] < control["mean"]:
                return Verdict(NOT_HELD, text + "; below the control beyond seed noise")
            if line.status != HELD:
                return line
            if beyond is False:
                return Verdict(NOT_MEASURABLE, text + "; not beyond the control by seed noise")
            return line
        return line

    return _needs_gap(judge)


def _control_fails(r: dict) -> Verdict:
    arms = r.get("arms", {})
    if "control" not in arms:
        return Verdict(NOT_MEASURABLE, "the control was not trained")
    rec = credit(arms["control"])
    vals = [v for v in rec["values"] if v is not None]
    if not vals:
        return Verdict(NOT_MEASURABLE, "no window needed the first token")
    text = f"control ({arms['control']['params']:,} parameters) credited {_fmt_rec(rec)}"
    return below({"values": vals}, RECOVERS, text)

def _on_sink_heads(arm: str, key: str, sign: int) -> Callable[[dict], Verdict]:
    def judge(r: dict) -> Verdict:
        a = r.get("arms", {}).get(arm)
        if a is None or f"{key}_r" not in a:
            return Verdict(NOT_MEASURABLE, f"`{arm}` was not trained")
        rs = a[f"{key}_r"]
        vals = [v for v in rs["values"] if v is not None]
        text = (f"Pearson r over (layer ≥ {r['start_layer']}, head) {_fmt_rec(rs)}; mean "
                f"{'sink probability' if key == 'sink' else 'gate score'} {a[f'{key}_mean']:.3f}")
        if not vals:
            return Verdict(NOT_MEASURABLE, text)
        return at_least({"values": [sign * v for v in vals]}, HEAD_R, text)

    return _needs_gap(judge)


def _streaming(r: dict) -> Verdict:
    s = r.get("streaming")
    if s is None or "sink" not in s["late_mean"]:
        return Verdict(NOT_MEASURABLE, "no streaming curve with a trained sink")
    m = s["late_mean"]
    lost = m["dropped"] - m["kept"]
    ratio = math.exp(m["sink"] - m["kept"])
    text = (f"{s['tokens']}-token held-out text, W {s['window']}, past the first window: loss {m['kept']:.3f} kept, "
            f"{m['dropped']:.3f} dropped, {m['sink']:.3f} dropped with the trained sink: perplexity ratio "
            f"{ratio:.3f} (sink / kept)")
    if lost <= 0:
        return Verdict(NOT_MEASURABLE, text + "; dropping the first token cost nothing here")
    return Verdict(HELD if ratio <= STREAM_RATIO else NOT_HELD, text)


def _retrofit(r: dict) -> Verdict:
    c = r.get("continued")
    if c is None:
        return Verdict(NOT_MEASURABLE, "not run (`--set continued_steps=N` trains the whole model on, with and "
                                       "without the gate)")
    b, g = c["baseline"], c["gated"]
    n = len(b["runs"])
    text = (f"after {c['steps']} steps ({c['tokens']:,} tokens), {n} data order{'s' if n > 1 else ''} each: F-Attn "
            f"{c['before']['f_attn']:.3f} before, {mean_pm(b['f_attn'])} without the gate, "
            f"{mean_pm(g['f_attn'])} with it; "
            f"loss {c['before']['loss']:.3f} → {mean_pm(b['loss'])} / {mean_pm(g['loss'])}")
    # the sink is not removed: in every data order, the gated run keeps most of the ungated run's F-Attn
    kept = all(gr["f_attn"] > REDUCTION * br["f_attn"] for br, gr in zip(b["runs"], g["runs"]))
    return Verdict(HELD if kept else NOT_HELD, text)


def mean_pm(stat: dict, spec: str = ".3f") -> str:
    """``mean ± std`` of a figure over data orders (the mean alone for one order; – where unmeasured)."""
    if stat["mean"] is None:
        return "–"
    one = format(stat["mean"], spec)
    if len([v for v in stat["values"] if v is not None]) < 2 or stat["std"] is None:
        return one
    return f"{one} ± {format(stat['std'], spec.lstrip('+'))}"  # a sign belongs to the mean, not to its spread


# (key, source, claim, judge, the arm it needs: a claim about an arm the study did not train is left out)
CLAIMS: list[tuple[str, str, str, Callable[[dict], Verdict], str | None]] = [
    ("lm-sink", "Xiao et al. 2024; Gu et al. 2025", "A pretrained LM parks attention on its first position "
     f"(F-Attn ≥ {SINK_OVER_UNIFORM:g}× uniform, Sink^ε > 0)", _sink_present, None),
    ("lm-massive", "Sun et al. 2024", f"It carries massive activations (M-Act / median ≥ {MASSIVE_RATIO:g})",
     _massive, None),
    ("lm-window", "StreamingLLM (Xiao et al. 2024)", "Under window attention the first token is needed: dropping it "
     f"raises the loss (≥ {MIN_GAP_SE:g} standard errors)", _window_needs_first, None),
    ("lm-noop", "Gu et al. 2025", "In full causal attention the sink is barely needed (dropping it costs ≤ "
     f"{100 * NOOP_SHARE:.0f} % of the window's loss)", _full_noop, None),
    ("lm-sink-arm", "HyGA; GPT-OSS", f"A learnable sink takes the first token's role (credited recovery ≥ "
     f"{RECOVERS:g}, beyond the control)", _takes_role("sink"), "sink"),
    ("lm-sink-bias-arm", "HyGA; GPT-OSS", f"A sink with a bias (mass and value) takes it (credited recovery ≥ "
     f"{RECOVERS:g}, beyond the control)", _takes_role("sink-bias"), "sink-bias"),
    ("lm-gate-arm", "Qiu et al. 2025", "A headwise output gate takes the first token's role (credited recovery ≥ "
     f"{RECOVERS:g}, beyond the control)", _takes_role("gate-headwise"), "gate-headwise"),
    ("lm-gate-elem-arm", "Qiu et al. 2025", "An elementwise output gate takes the first token's role (credited "
     f"recovery ≥ {RECOVERS:g}, beyond the control)", _takes_role("gate"), "gate"),
    ("lm-control", "(control)", f"A bias with no sink- or gate-like form does not (recovery < {RECOVERS:g})",
     _needs_gap(_control_fails), "control"),
    ("lm-sink-heads", "HyGA; GPT-OSS", f"The learnable sink's probability lands on the former sink heads (r ≥ {HEAD_R:g})",
     _on_sink_heads("sink", "sink", 1), "sink"),
    ("lm-gate-heads", "Qiu et al. 2025", f"The headwise gate closes on the former sink heads (r ≤ −{HEAD_R:g})",
     _on_sink_heads("gate-headwise", "gate", -1), "gate-headwise"),
    ("lm-streaming", "StreamingLLM", "Streaming without the first token keeps its perplexity with the trained sink "
     f"(within {100 * (STREAM_RATIO - 1):.0f} % of the first token kept)",
     _needs_gap(_streaming), "sink"),
    ("lm-retrofit", "Qiu et al. 2025, App. A.7", "A gate retrofitted during continued pretraining does not remove the "
     f"sink (gated F-Attn above {100 * REDUCTION:.0f} % of the ungated run's)", _retrofit, None),
]


def judge(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per claim: key, source, claim, verdict, measured. A claim about an arm the
    study did not train is left out."""
    rows = []
    asked = results["config"]["arms"]
    for key, source, statement, fn, arm in CLAIMS:
        if arm is not None and arm not in asked:
            continue
        v = fn(results)
        rows.append({"key": key, "source": source, "claim": statement, "verdict": v.status, "measured": v.measured})
    return rows
