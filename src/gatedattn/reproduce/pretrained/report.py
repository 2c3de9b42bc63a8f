"""The real-model study's report: its section (the main job's part 2) and ``report.md``
when it runs alone."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from gatedattn.infra.io import atomic_write_text
from gatedattn.reproduce.verdicts import uniform_first_token_attention
from gatedattn.reproduce.pretrained import claims as C
from gatedattn.reproduce.pretrained.arms import ARM_SPECS
from gatedattn.reproduce.pretrained.plots import make_plots
from gatedattn.reproduce.pretrained.results import PretrainedResults
from gatedattn.reproduce.study_report import provenance_table

CAPTIONS = {
    "sink_profile": "Per layer: attention on the first position (dotted: uniform), the value drain ‖v₀‖ / mean ‖vᵢ‖ "
                    "and the residual peak ‖h₀‖ / mean ‖hᵢ‖.",
    "first_token_map": "Attention on the first position, per layer and head.",
    "noop": "The loss with the first token in every query's view (kept) and without it (dropped), over the "
            "attention window; right: their gap with ± 2 standard errors over held-out windows.",
    "arm_curves": "Top: training loss of each arm (its own parameters only; the model frozen; a running mean of 5 "
                  "steps), first token dropped (solid) and kept (dotted), per data order; dashed: the untouched model "
                  "on held-out windows. Bottom: the paired loss the stopping rule reads, and where each order "
                  "stopped.",
    "heads": "Per head (layers the arms train): the untouched model's attention on the first token against the "
             "trained sink's probability and the gate's mean score, first token dropped.",
    "streaming": "Per-position loss over one long held-out text under window attention, each arm's curve from "
                 "its first data order (first token dropped); dashed: W.",
}


def _fmt(x, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _sink_rows(s: dict, uniform: float) -> list[str]:
    """The sink table's rows: first-token attention, Sink^ε, M-Act and where it sits, drain, peak."""
    strong = [i for i, f in enumerate(s["f_attn_per_layer"]) if f is not None and f > s["eps"]]
    rows = [f"| F-Attn (mean over layers) | {s['f_attn']:.3f} ({s['f_attn'] / uniform:.0f}× uniform) |",
            f"| layers with F-Attn > ε = {s['eps']:g} | {', '.join(map(str, strong)) or 'none'} |",
            f"| Sink^ε (share of heads above ε) | {s['sink_eps']:.2f} |",
            f"| M-Act / its ratio to the median | {s['m_act']:.0f} / {_fmt(s['m_act_ratio'], '.0f')} |"]
    top = (s.get("m_act_channels") or {}).get("top") or []
    if top:
        rows.append(f"| where M-Act sits | channel {top[0]['channel']}, position {top[0]['position']}, layer "
                    f"{top[0]['layer']} |")
    drain = [d for d in s.get("value_drain_per_layer") or [] if d is not None]
    peak = [p for p in s.get("residual_peak_per_layer") or [] if p is not None]
    if drain:
        rows.append(f"| value drain ‖v₀‖ / mean ‖vᵢ‖, lowest layer | {min(drain):.2f} |")
    if peak:
        rows.append(f"| residual peak ‖h₀‖ / mean ‖hᵢ‖, highest layer | {max(peak):.0f} |")
    return rows


def _first_token_text(first: dict) -> str:
    """How the first position was chosen: the mode, the id and, for ``auto``, why."""
    what = "no special token: position 0 is the first text token" if first["mode"] == "none" else (
        f"{first['mode']}, id {first['id']}")
    return what + (f"; {first['why']}" if first.get("why") else "")


def _sink_lines(r: dict) -> list[str]:
    s, m = r["sink"], r["model"]
    uniform = uniform_first_token_attention(s["seq_len"] - 1)
    cut = f" (cut from {m['full_layers']}: a quick run)" if m["layers"] < m["full_layers"] else ""
    lines = [f"{s['windows']['count']} held-out windows of {s['windows']['length']} positions, each one document "
             f"stretch after the first token ({_first_token_text(m.get('first_token') or s['first_token'])}), no "
             f"separator inside; uniform causal attention would put {uniform:.3f} on the first position.", "",
             "| | this model |", "|---|---:|", *_sink_rows(s, uniform), "",
             f"Validation loss {_fmt(s.get('val_loss'))} nats. Model: {m['name']}, {m['layers']} layers{cut}, d_model "
             f"{m['d_model']}, {m['heads']} heads ({m['kv_heads']} KV), {m['params'] / 1e6:.0f} M parameters, fp32.", ""]
    plain = r.get("noop_plain") or []
    if plain:
        lines += ["With no special first token (position 0 an ordinary text token): " + "; ".join(
            f"{'full attention' if p['window'] == 0 else 'W ' + str(p['window'])} Δ {p['gap']:+.3f} ± "
            f"{p['gap_se']:.3f}" for p in plain) + " nats when it is dropped.", ""]
    return lines


def _noop_lines(r: dict) -> list[str]:
    lines = ["| attention | loss, first token kept | dropped | Δ (nats) |", "|---|---:|---:|---:|"]
    for p in r["noop"]:
        name = "full causal" if p["window"] == 0 else f"window W = {p['window']}"
        lines.append(f"| {name} | {p['kept']:.3f} | {p['dropped']:.3f} | {p['gap']:+.3f} ± {p['gap_se']:.3f} |")
    lines += ["", f"The arms' window: W = {r['window']} ({r['window_why']})." if r.get("window") else
              f"No window was chosen ({r['window_why']}), so no arm trained.", ""]
    return lines


def _arm_lines(r: dict) -> list[str]:
    cfg, u = r["config"], r["untouched"]
    stop = (f"until the paired loss (dropped − kept) on {cfg['dev_windows']} development windows (training text, "
            f"outside the pool), looked at before the first step and every {cfg['stop_every']} steps, had not "
            f"beaten its best earlier look by {cfg['stop_tol']:g} nats for {cfg['stop_patience']} looks in a row, "
            f"{cfg['steps']} steps at the most" if "stop_every" in cfg else f"for {cfg['steps']} steps")
    precision = r.get("arm_precision")
    if precision:
        dtype = 'bf16 autocast' if precision['dtype'] == 'bf16' else 'fp32'
        stop += (f"; steps and the stopping rule's looks in {dtype} ({precision['reason']}), every held-out loss "
                 "evaluated in fp32" if "looks" in precision else
                 f"; steps in {dtype} ({precision['reason']}), every loss evaluated in fp32")
    lines = [f"Frozen model, window W = {r['window']}; each arm trains only its own parameters in layers "
             f"{r['start_layer']}–{r['model']['layers'] - 1} (from the first layer whose F-Attn exceeds "
             f"{cfg['sink_layers_eps']:g}; below, the model runs untouched) with Adam, {cfg['batch']} × "
             f"{cfg['seq_len']} training tokens a step, {stop}; {cfg['seeds']} data orders, once with the first "
             f"token dropped and once kept, on the same batches. Untouched model on {u['windows']} held-out windows: "
             f"{u['kept']:.3f} kept, {u['dropped']:.3f} dropped." + _sink_start_line(r), "",
             "Paired = 1 − (L_arm,dropped − L_arm,kept) / (L_dropped − L_kept): adaptation to the text, which lowers "
             "both, is taken out. Unpaired = (L_dropped − L_arm,dropped) / (L_dropped − L_kept). An arm is credited "
             "with the smaller of the two, and with nothing where its kept-mode loss rose by more than "
             f"{cfg.get('kept_tol', 0):g} nats: an arm that only damages the kept mode takes nothing back.", "",
             "| arm | what | parameters | learning rate | paired | unpaired | kept loss change | **credited** | "
             "steps |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, a in r["arms"].items():
        rec, unp, kept = a["recovered"], a["unpaired"], a["kept_change"]
        cred = C.credit(a)
        lrs = " / ".join(f"{cfg[f]:g}" for f in _lr_fields(name))
        steps = ", ".join(f"{n}{'' if c else '*'}" for n, c in zip(a.get("steps", []), a.get("converged", [])))
        lines.append(f"| `{name}` | {a['what']} | {a['params']:,} | {lrs} | {C.mean_pm(rec, '.2f')} | "
                     f"{C.mean_pm(unp, '.2f')} | {C.mean_pm(kept, '+.3f')} | **{C.mean_pm(cred, '.2f')}** | "
                     f"{steps or '–'} |")
    lines += ["", "Mean ± standard deviation over the data orders; steps per order (* where the cap, not the rule, "
                  "stopped it).", ""]
    shares = _shares(r)
    if shares:
        lines += [shares, ""]
    elif "sink-bias" not in r.get("arms", {}):
        lines += [EXTENDED_LINE, ""]
    return lines


# where the arms the default leaves out were run and committed
EXTENDED_LINE = ("The first token taken apart (the sink with a bias: its mass and its value) and the elementwise gate "
                 "beside the headwise one run in the extended setting (`--set arms=sink,sink-bias,gate,control`, step 4 "
                 "of `scripts/reproduce_extended.sh`); a committed run: `docs/real-model-extended/report.md`. The "
                 "same arms at the narrower window W 64, where the first token's job is larger (`--set window=64`, "
                 "step 5): `docs/real-model-w64/report.md`.")


def _sink_start_line(r: dict) -> str:
    """How the sink arms start in each mode (runs made with the development-window rule
    started the kept copy's sink absent)."""
    if "stop_every" not in r["config"] or not any(n.startswith("sink") for n in r["arms"]):
        return ""
    return (" A sink starts, with the first token dropped, at each head's measured first-token logit (at 0 in "
            "`sink-zero`); with it kept, at a hundredth of that token's weight (the logit − ln 100): absent but "
            "trainable, so the kept copy starts as the model is.")


def _lr_fields(name: str) -> list[str]:
    return [f for _, f in ARM_SPECS[name].trains] if name in ARM_SPECS else []


def _shares(r: dict) -> str | None:
    """What share of Δ the first token's two jobs explain: the mass (the sink alone), the
    value (the bias alone: the control) and both (the sink with a bias), credited."""
    arms = r.get("arms", {})
    if not all(k in arms for k in ("sink", "control", "sink-bias")):
        return None
    mass, value, both = (C.credit(arms[k])["mean"] for k in ("sink", "control", "sink-bias"))
    if None in (mass, value, both):
        return None
    return (f"The first token's two jobs, as credited shares of Δ: a place to park probability (the sink alone) "
            f"{mass:.2f}; the drained value vector it adds (the bias alone, the control) {value:.2f}; both together "
            f"(the sink with a bias) {both:.2f}.")


def _streaming_lines(r: dict) -> list[str]:
    s = r["streaming"]
    m = s.get("late_mean") or {}
    if "kept" not in m:
        return []
    lines = [f"One held-out document, {s['tokens']} tokens, W = {s['window']}; the mean loss past the first window "
             "and its perplexity over that of the first token kept:", "",
             "| | loss | perplexity ratio |", "|---|---:|---:|"]
    for key, loss in m.items():
        name = {"full": "full attention", "kept": "first token kept", "dropped": "first token dropped"}.get(
            key, f"dropped, `{key}` trained (order 0)")
        lines.append(f"| {name} | {loss:.3f} | {math.exp(loss - m['kept']):.3f} |")
    return lines + [""]


def _continued_lines(r: dict) -> list[str]:
    c, cfg = r["continued"], r["config"]
    n = len(c["baseline"]["runs"])
    lines = [f"The whole model trained on for {c['steps']} steps of {cfg['batch']} × {cfg['seq_len']} tokens (AdamW, LR "
             f"{cfg['continued_lr']:g}, full causal attention), as it is and with a G1 gate retrofitted (identity "
             f"init), on the same windows in the same order; {n} data order{'s' if n > 1 else ''} each, mean ± "
             "standard deviation over them.", "",
             "| | held-out loss | F-Attn | Sink^ε | M-Act / median |", "|---|---:|---:|---:|---:|"]
    b = c["before"]
    lines.append(f"| before | {b['loss']:.3f} | {b['f_attn']:.3f} | {b['sink_eps']:.2f} | "
                 f"{b['m_act']:.0f} / {_fmt(b['m_act_ratio'], '.0f')} |")
    for name, label in (("baseline", "trained on, no gate"), ("gated", "trained on, gated")):
        m = c[name]
        pm = C.mean_pm
        lines.append(f"| {label} | {pm(m['loss'])} | {pm(m['f_attn'])} | {pm(m['sink_eps'], '.2f')} | "
                     f"{pm(m['m_act'], '.0f')} / {pm(m['m_act_ratio'], '.0f')} |")
    return lines + [""]


def pretrained_section(part: PretrainedResults, out: Path, heading: str = "##", title: str | None = None,
                       prefix: str | None = None) -> list[str]:
    """The study's lines (claims, tables, plots) for a report in ``out``; writes its plots
    there. ``prefix`` replaces the heading's marks (a part of the main job: "## Part 2:").
    The claims, tables and plots read the results as ``results.json`` holds them."""
    r = part.to_dict()
    made = make_plots(r, out)
    rows = C.judge(r)
    title = title or "a real pretrained language model, frozen"
    lines = [f"{prefix or heading} {title} ({part.minutes:.1f} min)", "",
             "What the papers say the attention sink is for, tested on a pretrained model with its weights frozen: "
             "is the first position a sink, is it needed, and can a learnable sink or an output gate take its job? "
             f"Text: the bundled corpus ({part.text}), training windows from its training documents, every "
             "measurement on its validation documents, tokenized with the model's own tokenizer.", "",
             "| source | claim | this run | verdict |", "|---|---|---|---|"]
    lines += [f"| {c['source']} | {c['claim']} | {c['measured']} | **{c['verdict']}** |" for c in rows]
    lines += ["", f"{heading}# The sink as it is", "", *_sink_lines(r), f"{heading}# The first token as a no-op", "",
              *_noop_lines(r)]
    if part.arms:
        lines += [f"{heading}# Who can take its job", "", *_arm_lines(r)]
    if part.streaming:
        lines += [f"{heading}# Streaming", "", *_streaming_lines(r)]
    if part.continued:
        lines += [f"{heading}# A gate retrofitted during continued pretraining (App. A.7)", "", *_continued_lines(r)]
    for name, file in made.items():
        lines += [f"![{name}]({file})", "", f"*{CAPTIONS[name]}*", ""]
    return lines


def write_pretrained_report(part: PretrainedResults, meta: Mapping[str, Any], out: str | Path) -> Path:
    """``report.md`` of the study run alone (``meta``: its command, machine, software and date)."""
    out = Path(out)
    lines = ["# gatedattn: attention sinks in a real pretrained language model", "", *provenance_table(meta)]
    lines += pretrained_section(part, out, title="Results")
    lines += ["## Reproduce", "", "```bash", meta["command"], "```", "",
              "Every figure above comes from `results.json` beside this report.", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


def pretrained_part(part: PretrainedResults, out: Path, heading: str) -> list[str]:
    """The study as a part of the main job (``heading``: "## Part N:")."""
    return pretrained_section(part, out, heading="##", title=None, prefix=heading)
