"""Turn a reproduction's ``results.json`` into ``report.md`` and PNG plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gatedattn import paper
from gatedattn.analysis import plots
from gatedattn.analysis.registry import TEXT_METRICS, columns
from gatedattn.infra.fmt import fmt_cell
from gatedattn.infra.io import atomic_write_text
from gatedattn.reproduce.claims import judge_all
from gatedattn.reproduce.verdicts import MASSIVE_RATIO, REDUCTION, SINK_OVER_UNIFORM
from gatedattn.reproduce.registry import Section
from gatedattn.reproduce.study_report import provenance_table

# A part of the main job before its natural-text part: (its results, output directory, its heading) -> lines
Part = Callable[[dict, Path, str], list[str]]

SUMMARY_COLUMNS = columns(TEXT_METRICS)
OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon (hidden matrices) + AdamW"}


def _mfu_note(speed: dict | None) -> str:
    """`` (MFU 12.3 %)`` after a step time: model FLOP/s over the machine's measured peak (gatedattn.models.mfu)."""
    m = (speed or {}).get("mfu")
    return "" if m is None else f" (MFU {100 * m:.1f} %)"


def _runs(results: dict, variant: str) -> list[dict]:
    return results["variants"][variant]["runs"]


def make_plots(results: dict, out: Path) -> dict[str, str]:
    """Write every plot the results allow; returns {name: file name}."""
    variants = list(results["variants"])
    plots.assign_colors(variants)
    made: dict[str, str] = {}

    def add(name: str, fn, *args, **kw) -> None:
        path = out / f"{name}.png"
        fn(*args, path, **kw)
        made[name] = path.name

    val = {v: [r["val_curve"] | {"loss": r["val_curve"]["val_loss"]} for r in _runs(results, v)] for v in variants}
    add("val_loss", plots.plot_loss_curves, {v: [{"steps": c["tokens"], "loss": c["loss"]} for c in cs] for v, cs in val.items()},
        title="Validation loss", xlabel="tokens seen", ylabel="validation loss")
    train = {v: [{"steps": r["curve"]["tokens"], "loss": r["curve"]["loss"]} for r in _runs(results, v)] for v in variants}
    add("train_loss", plots.plot_loss_curves, train, title="Training loss", xlabel="tokens seen")
    first = {v: _runs(results, v)[0]["analysis"] for v in variants}
    add("f_attn_per_layer", plots.plot_per_layer, {v: a["f_attn_per_layer"] for v, a in first.items()},
        ylabel="F-Attn (attention on token 0)", title="First-token attention per layer (seed 0)")
    add("m_act_per_layer", plots.plot_per_layer, {v: a["m_act_per_layer"] for v, a in first.items()},
        ylabel="max |h| of the residual stream", title="Massive activations per layer (seed 0)", log=True)
    hists = {v: (a["gate_histogram"]["edges"], a["gate_histogram"]["counts"])
             for v, a in first.items() if a.get("gate_histogram")}
    if hists:
        add("gate_histograms", plots.plot_gate_histograms, hists)
    maps = _attention_maps(first)
    if maps:
        add("attention_maps", plots.plot_attention_maps, maps, title="Head-averaged attention, first validation sequence")
    for metric, label in (("f_attn", "F-Attn"), ("m_act", "M-Act")):
        series = _over_training(results, variants, metric)
        if series:
            add(f"{metric}_over_training", plots.plot_over_training, series, ylabel=label,
                title=f"{label} during training (seed 0)", log=metric == "m_act")
    ext, train_len = _extrapolation(results, variants)
    if ext:
        add("extrapolation", plots.plot_extrapolation, ext, train_len=train_len)
    return made


def _attention_maps(first: dict) -> dict:
    maps = {}
    for v, a in first.items():
        for layer, grid in sorted((a.get("attention_maps") or {}).items(), key=lambda kv: int(kv[0])):
            maps[f"{v} · layer {layer}"] = grid
    return maps


def _over_training(results: dict, variants: list[str], metric: str) -> dict:
    series = {}
    for v in variants:
        ot = _runs(results, v)[0].get("over_training") or {}
        if ot.get("tokens") and ot.get(metric):
            series[v] = {"tokens": ot["tokens"], "value": ot[metric]}
    return series


def _extrapolation(results: dict, variants: list[str]) -> tuple[dict, int | None]:
    ext, train_len = {}, None
    for v in variants:
        e = _runs(results, v)[0].get("extrapolation")
        if e:
            ext[v] = {m: {"lengths": e["lengths"], "loss": losses} for m, losses in e["methods"].items()}
            train_len = e["train_len"]
    return ext, train_len


def _step_plan(cfg: dict) -> str:
    """How the step count was chosen; every variant trains on the same batches either way."""
    same = "every variant trains on the same batches in the same order (identical tokens)"
    timed = cfg.get("step_seconds") or {}
    if cfg.get("budget_minutes") is None or not timed:
        return f"{same}; fixed step count"
    per_step = ", ".join(f"{v} {t:.2f} s" for v, t in timed.items())
    return (f"{same}; steps fitted to a {cfg['budget_minutes']:g}-minute budget from timing each variant's step here "
            f"(medians of interleaved rounds: {per_step})")


def _departures(cfg: dict) -> str | None:
    """How the run's layers differ from the papers' (Qwen3-style) layers, and why."""
    attention = ((cfg.get("train") or {}).get("model") or {}).get("attention") or {}
    if attention.get("qk_norm") is False:
        return ("no q/k RMSNorm (the papers' Qwen3 layers normalise queries and keys per head); the sink "
                "calibration (`gatedattn reproduce --study calibrate`, docs/sink-calibration) measured the baseline's "
                "first-token sink forming within a CPU budget only without it and at a high learning rate")
    return None


def _precision(cfg: dict, meta: dict) -> str:
    """The precision the run computed in: what was asked and what ``auto`` resolved to."""
    chosen = meta.get("precision")
    if chosen is None:
        return str(cfg["dtype"])
    name = {"bf16": "bf16 autocast", "fp32": "fp32"}[chosen["dtype"]]
    return f"{name} (asked `{cfg['dtype']}`: {chosen['reason']})"


def _compile_row(d: dict) -> str:
    """The compile decision in words: as asked, or auto's figures."""
    state = "on" if d["compile"] else "off"
    if d["mode"] != "auto":
        return f"{state} (asked)"
    if "compiled_steps" not in d:
        return f"{state} (auto: fixed steps run eager)"
    per_step = ", ".join(f"`{v}` {d['compiled_step_s'][v]:.2f} s vs {d['eager_step_s'][v]:.2f} s"
                         for v in d["compiled_step_s"])
    compile_s = max(d["compile_s"].values())
    return (f"{state} (auto, timed here: compiled vs eager step {per_step}; up to {compile_s:.0f} s to compile each "
            f"run; {d['compiled_steps']} compiled vs {d['eager_steps']} eager steps fit the budget)")


def _setup_table(results: dict) -> list[str]:
    cfg, meta = results["config"], results["meta"]
    departures = _departures(cfg)
    rows = [
        ("command", f"`{meta['command']}`"),
        ("machine", meta["machine"]),
        ("software", f"python {meta['python']}, torch {meta['torch']}, gatedattn {meta['gatedattn']} ({meta['code_version']})"),
        ("date", f"{meta['started']} · {meta['duration_min']:.1f} min"),
        ("data", meta["data"]),
        ("model", f"`{cfg['preset']}` preset: {meta['model']}"),
        ("training", f"{cfg['steps']} steps × {cfg['batch_tokens']:,} tokens = {cfg['steps'] * cfg['batch_tokens'] / 1e6:.2f} M tokens per run, "
                     f"LR {cfg['lr']:g} (warm-up {cfg['warmup_steps']}, {cfg.get('schedule', 'cosine')}), {cfg['optimizer']}, "
                     f"seeds {cfg['seeds']}; "
                     f"{_step_plan(cfg)}"),
        *([("departures", departures)] if departures else []),
        ("precision", _precision(cfg, meta)),
        *([("torch.compile", _compile_row(cfg["compile_choice"]))] if cfg.get("compile_choice") else []),
        ("BOS", "every training and validation sequence starts with a BOS token (a fixed first token lets a sink form)"),
        ("analysis", f"{meta['analysis_tokens']:,} validation tokens, sequences of {cfg['seq_len']} (+BOS)"),
    ]
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def write_report(results: dict, out: str | Path, sections: Sequence[Section] = (),
                 parts: Sequence[tuple[str, Part]] = (), *, plots: bool = True) -> Path:
    """Write ``report.md`` and its plots into ``out``; returns the report path. ``parts``:
    the main job's parts before natural text, as (results key, writer), each written as
    "Part N" where ``results`` holds it. Each of ``sections`` adds its lines (and plots)
    before the closing "Reproduce" section. ``plots=False``: natural text's plots are not
    drawn and the report links none (its text alone, e.g. to read or compare it; ~0.25 s
    a plot saved); the parts and sections write theirs as ever."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if "variants" not in results:
        return _write_parts_report(results, out, parts)
    return _write_text_report(results, out, sections, parts, make_plots(results, out) if plots else {})


def _write_text_report(results: dict, out: Path, sections: Sequence[Section],
                       parts: Sequence[tuple[str, Part]], made: dict[str, str]) -> Path:
    """``report.md`` of a job with natural text: the parts before it, then its setup,
    claims, results, per-layer tables and plots, and the sections folded in."""
    claims = results.get("claims") or judge_all(results)
    variants = list(results["variants"])
    lines = ["# gatedattn reproduction report", ""]
    lines += [
        "Small-scale check of the claims of *Gated Attention for LLMs* (Qiu et al. 2025) and "
        "*Hybrid Gated Attention* (HyGA): each variant is trained from the same initial seed on the same "
        "batches in the same order for the same number of tokens, then analysed on held-out text.",
        "",
        *(lines_ for lines_ in _parts(results, out, parts)),
        *_text_intro(results, sum(1 for key, _ in parts if results.get(key))),
        "## Setup",
        "",
        *_setup_table(results),
        "",
        "## Claims",
        "",
        "| source | claim | paper | this run | verdict |",
        "|---|---|---|---|---|",
    ]
    for c in claims:
        lines.append(f"| {c['source']} | {c['claim']} | {c['paper']} | {c['measured']} | **{c['verdict']}** |")
    lines += [
        "",
        f"*held*: the measured difference goes the paper's way (F-Attn, Sink and M-Act claims: the gated value at most {100 * REDUCTION:.0f} % of the baseline's; beyond seed noise where several seeds ran: "
        "|Δmean| > 2·√(σ₁² + σ₂²), and the factor itself beyond it; a figure against a line: the band mean ± 2σ "
        "on the claim's side); *did not hold*: it goes the other way; *not measurable*: within noise, "
        "not run, or the effect needs more tokens than this budget. Sink claims are judged only where the baseline "
        f"shows a sink by the measure the claim is about (F-Attn claims: F-Attn, averaged or at the strongest layer, "
        f"≥ {SINK_OVER_UNIFORM:g}× the uniform value (1/T)·Σ_{{i=1..T}} 1/(i+1); the Sink^ε claim: a baseline head "
        "above ε), "
        f"massive-activation claims only where the baseline's M-Act / median ≥ {MASSIVE_RATIO:g}; the timing claim "
        "needs interleaved rounds and is not measurable within two standard errors of no difference. "
        f"Paper figures come from {paper.SCALE}; this run is orders of magnitude smaller, so directions matter, "
        "not sizes.",
        "",
        "## Results (mean ± std over seeds)",
        "",
        "| variant | " + " | ".join(label for _, label, _ in SUMMARY_COLUMNS) + " |",
        "|---|" + "---:|" * len(SUMMARY_COLUMNS),
    ]
    for v in variants:
        s = results["summary"][v]
        lines.append(f"| `{v}` | " + " | ".join(fmt_cell(s.get(k), d) for k, _, d in SUMMARY_COLUMNS) + " |")
    timing = results.get("step_time") or {}
    if timing:
        lines += ["", f"Training step (forward, backward, {OPTIMIZER_NAMES.get(results['config']['optimizer'], results['config']['optimizer'])}; " + f"{results['config']['micro_batch']}×{results['config']['seq_len']} tokens), "
                  "medians of interleaved rounds after training: " + ", ".join(f"`{v}` {1000 * t:.0f} ms" + _mfu_note((results.get("step_mfu") or {}).get(v)) for v, t in timing.items()) + "."]
    lines += ["", "F-Attn: attention on token 0 (the BOS), averaged over heads, queries 1..T-1 and layers. "
              "Sink^ε: fraction of (layer, head) pairs whose mean attention on token 0 exceeds 0.3. "
              "M-Act: largest |activation| of the residual stream over layers.", ""]
    lines += _per_layer_tables(results)
    captions = {
        "val_loss": "Validation loss against tokens seen.",
        "train_loss": "Training loss.",
        "f_attn_per_layer": "First-token attention per layer.",
        "m_act_per_layer": "Largest residual-stream activation per layer (log scale).",
        "gate_histograms": "Distribution of gate scores over tokens, layers and channels.",
        "attention_maps": "Attention maps of a middle layer, averaged over heads.",
        "f_attn_over_training": "F-Attn as training proceeds.",
        "m_act_over_training": "M-Act as training proceeds.",
        "extrapolation": "Validation loss at multiples of the training context: plain RoPE, NTK and YaRN scaling.",
    }
    lines += ["## Plots", ""]
    for name, file in made.items():
        lines += [f"### {captions.get(name, name)}", "", f"![{name}]({file})", ""]
    lines += _extrapolation_table(results)
    for section in sections:
        lines += section(results, out)
    folded = results.get("folded") or []
    lines += ["## Reproduce", "", "```bash", *(f["command"] for f in folded if f.get("command")),
              results["meta"]["command"], "```", ""]
    for f in folded:
        lines += [f"The {' and '.join(k.replace('_', ' ') for k in f['studies'])} came from `{f['dir']}` "
                  f"(machine: {f.get('machine')}), written by its command above.", ""]
    lines += ["All figures above come from `results.json` beside this report.", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


NATURAL_SINK_TOKENS = ("natural-text sinks need far more training than a CPU gives: Gu et al. 2024 (\"When "
                       "Attention Sink Emerges in Language Models\") study their emergence in ~60 M-parameter models "
                       "pretrained on billions of tokens")


TEXT_LEFT_OUT = ("natural text (the project's models trained from scratch on the bundled corpus) is not part of "
                 f"this job: {NATURAL_SINK_TOKENS}, while two CPU cores train a few million tokens in its minutes, "
                 "so it judged almost none of its claims here. It runs as `gatedattn reproduce --study text` (or "
                 "this job with `--with-text`), in `scripts/reproduce_extended.sh` and on a GPU with "
                 "`scripts/reproduce_gpu.sh`.")


def _write_parts_report(results: dict, out: Path, parts: Sequence[tuple[str, Part]]) -> Path:
    """``report.md`` of a main job without its natural-text part: its setup, every part it
    ran, where natural text went, and how to run it again."""
    meta = results["meta"]
    lines = ["# gatedattn reproduction report", "",
             "Small-scale checks of the claims of *Gated Attention for LLMs* (Qiu et al. 2025) and *Hybrid Gated "
             "Attention* (HyGA): the mechanism on a task built to show it, and the attention sink of a real "
             "pretrained language model with what can take its job.", "",
             *provenance_table(meta),
             *_parts(results, out, parts),
             f"**Natural text:** {TEXT_LEFT_OUT}", "",
             "## Reproduce", "", "```bash", meta["command"], "```", "",
             "All figures above come from `results.json` beside this report.", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


def _parts(results: dict, out: Path, parts: Sequence[tuple[str, Part]]) -> list[str]:
    """The lines of every part ``results`` holds, numbered in order."""
    lines: list[str] = []
    present = [(key, part) for key, part in parts if results.get(key)]
    for number, (key, part) in enumerate(present, 1):
        lines += part(results[key], out, f"## Part {number}:")
    return lines


def _text_intro(results: dict, n_parts: int) -> list[str]:
    """The natural-text part's heading (after ``n_parts`` others) and its one-sentence
    scale statement (with what the budget cut)."""
    if not n_parts:
        return []
    cfg = results["config"]
    tokens = cfg.get("steps", 0) * cfg.get("batch_tokens", 0)
    minutes = results.get("text_minutes")
    lines = [f"## Part {n_parts + 1}: natural text" + (f" ({minutes:.1f} min)" if minutes else ""), "",
             f"**Scale:** {NATURAL_SINK_TOKENS}; each run here trained {tokens / 1e6:.2f} M tokens, so the "
             "natural-text verdicts below say what forms at this scale, not what the papers measured.", ""]
    if cfg.get("cuts"):
        lines += ["**What the budget cut:** " + "; ".join(cfg["cuts"]) + ".", ""]
    return lines


def _per_layer_tables(results: dict) -> list[str]:
    variants = list(results["variants"])
    first = {v: _runs(results, v)[0]["analysis"] for v in variants}
    n_layers = len(next(iter(first.values()))["f_attn_per_layer"])
    lines = ["### Per layer (seed 0)", "", "| layer | " + " | ".join(f"F-Attn `{v}`" for v in variants) + " | "
             + " | ".join(f"M-Act `{v}`" for v in variants) + " |", "|---|" + "---:|" * (2 * len(variants))]
    for i in range(n_layers):
        f = " | ".join(f"{first[v]['f_attn_per_layer'][i]:.4f}" for v in variants)
        m = " | ".join(f"{first[v]['m_act_per_layer'][i]:.1f}" for v in variants)
        lines.append(f"| {i} | {f} | {m} |")
    return lines + [""]


def _extrapolation_table(results: dict) -> list[str]:
    lines: list[str] = []
    for v in results["variants"]:
        e = _runs(results, v)[0].get("extrapolation")
        if not e:
            continue
        if not lines:
            lengths = e["lengths"]
            lines = ["### Extrapolation (validation loss, seed 0)", "",
                     "| variant | method | " + " | ".join(f"{L // e['train_len']}× ({L})" for L in lengths) + " |",
                     "|---|---|" + "---:|" * len(lengths)]
        for method, losses in e["methods"].items():
            cells = " | ".join("–" if x is None else f"{x:.3f}" for x in losses)
            lines.append(f"| `{v}` | {method} | {cells} |")
    return lines + [""] if lines else []
