"""The mechanism study's report: its section (tables, claims, plots), its standalone page,
and its part of the main job's report."""

from __future__ import annotations

from pathlib import Path

from gatedattn.analysis import plots
from gatedattn.analysis.registry import MECHANISM_METRICS, columns
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fmt import fmt_cell
from gatedattn.infra.io import atomic_write_text
from gatedattn.reproduce.mechanism.claims import DRAIN, PEAK, REMOVAL_RATIO, SINK_SHARE, SINKING
from gatedattn.reproduce.mechanism.config import SINKS, MechanismConfig
from gatedattn.reproduce.mechanism.results import MechanismResults

COLUMNS = columns(MECHANISM_METRICS)


def _seed_curves(runs: list[dict], key: str) -> list[dict[str, list[float]]]:
    out = []
    for r in runs:
        steps, values = r["curve"]["step"], r["curve"].get(key) or []
        pairs = [(s, v) for s, v in zip(steps, values) if v is not None]
        if pairs:
            out.append({"steps": [p[0] for p in pairs], "loss": [p[1] for p in pairs]})
    return out


def make_plots(results: MechanismResults, out: Path) -> dict[str, str]:
    """Per depth: BOS attention by query class over training (baseline vs the gated and sink
    variants) and the gate score by class over training; returns {name: file name}."""
    made: dict[str, str] = {}
    for depth, block in results.depths.items():
        runs = block["runs"]
        figures = (
            (f"bos_attention_L{depth}", "bos_attn", ("ordinary", "trigger"),
             lambda v, cls: v in ("baseline", "gated") or cls == "ordinary",
             f"Attention on BOS by query class, {depth} layer(s)", "attention probability on BOS"),
            (f"gate_score_L{depth}", "gate", ("trigger", "ordinary"), lambda v, cls: True,
             f"Gate score by query class, {depth} layer(s)", "mean gate score"),
        )
        for name, metric, classes, keep, title, ylabel in figures:
            curves = {f"{v} · {cls}": c for v in runs for cls in classes
                      if (c := _seed_curves(runs[v], f"{metric}_{cls}")) and keep(v, cls)}
            if curves:
                plots.plot_loss_curves(curves, out / f"{name}.png", title=title, ylabel=ylabel, xlabel="training step")
                made[name] = f"{name}.png"
        made.update(_sink_plots(depth, block, out))
    return made


def _sink_plots(depth: str, block: dict, out: Path) -> dict[str, str]:
    """The learnable sink's share and the BOS attention of ordinary positions over
    training, one line per seed (which of the two no-ops wins, and when), and every
    seed's final BOS attention (and sink share) per variant as a strip."""
    made: dict[str, str] = {}
    runs = block["runs"]
    curves = {}
    for v in (v for v in SINKS if v in runs):
        for r in runs[v]:
            for key, what in (("sink_mass_ordinary", "sink share"), ("bos_attn_ordinary", "BOS")):
                c = _seed_curves([r], key)
                if c:
                    curves[f"{v} s{r['seed']} · {what}"] = c[0]
    if curves:
        name = f"learnable_sink_L{depth}"
        plots.plot_loss_curves(curves, out / f"{name}.png", xlabel="training step",
                               title=f"Learnable sink vs BOS, ordinary positions, per seed, {depth} layer(s)",
                               ylabel="attention probability")
        made[name] = f"{name}.png"
    strip = {}
    for v, s in block["summary"].items():
        if s.get("bos_attn_ordinary"):
            strip[f"{v} · BOS"] = s["bos_attn_ordinary"].get("values") or [s["bos_attn_ordinary"]["mean"]]
        if s.get("sink_mass_ordinary"):
            strip[f"{v} · sink"] = s["sink_mass_ordinary"].get("values") or [s["sink_mass_ordinary"]["mean"]]
    if strip:
        name = f"seeds_L{depth}"
        plots.plot_seed_strip(strip, out / f"{name}.png", threshold=SINK_SHARE, ylabel="attention probability",
                              title=f"Ordinary positions, per seed, {depth} layer(s)")
        made[name] = f"{name}.png"
    return made


FIGURE_TEXT = {"bos": "BOS attention", "gate": "Gate score", "learnable": "Learnable sink vs BOS, per seed",
               "seeds": "Per-seed values"}


def _depth_lines(depth: str, block: dict, cfg: dict, made: dict[str, str], heading: str) -> list[str]:
    """One depth's claims, table and plots."""
    where = block.get("strongest_layer")
    lines = [f"{heading}# {depth} layer{'s' if depth != '1' else ''}", ""]
    if where is not None and depth != "1":
        lines += [f"Claims and the table are at layer {where + 1} of {depth}, where the baseline's BOS attention "
                  f"from ordinary positions is strongest (seed mean); every variant is read at the same layer.", ""]
    if block["claims"]:
        lines += ["| claim | the papers | this run | verdict |", "|---|---|---|---|"]
        lines += [f"| {c['claim']} | {c.get('paper', '')} | {c['measured']} | **{c['verdict']}** |"
                  for c in block["claims"]] + [""]
    lines += _summary_table(block["summary"], cfg, max((len(r) for r in block["runs"].values()), default=0))
    for name, file in made.items():
        if name.endswith(f"_L{depth}"):
            what = FIGURE_TEXT[name.split("_")[0]]
            lines += [f"![{what}, {depth} layer(s)]({file})", ""]
    return lines


def missing_variants(results: MechanismResults) -> list[str]:
    """The study's default first-depth variants these results do not hold (results
    written before the study trained them)."""
    first = results.depths.get(str(results.config["depths"][0]), {})
    have = set(first.get("runs", {}))
    return [v for v in MechanismConfig().variants if v not in have]


def _summary_table(summary: dict[str, dict], cfg: dict, seeds: int) -> list[str]:
    """The variants' figures (mean ± std over seeds) and what bounds the losses."""
    lines = ["| variant | " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    lines += [f"| `{v}` | " + " | ".join(fmt_cell(s.get(k), d) for k, _, d in COLUMNS) + " |"
              for v, s in summary.items()]
    floor = next((s.get("bigram_floor") for s in summary.values() if s.get("bigram_floor")), None)
    return lines + ["", f"Mean ± std over {seeds} seed(s), on {cfg['analysis_sequences']} sequences drawn "
                        f"apart from the training data. The lowest possible bigram loss (the entropy of the true "
                        f"bigram rows) is {fmt_cell(floor, 3)}; the copy loss can reach 0.", ""]


def mechanism_section(results: MechanismResults, out: Path, heading: str = "##", title: bool = True) -> list[str]:
    """Markdown lines of the study's results (writes its plots into ``out``)."""
    made = make_plots(results, out)
    task, cfg = results.task, results.config
    lines = [f"{heading} Bigram-Backcopy: the sink's mechanism", ""] if title else []
    lines += [
        f"Task: {task['description']}. {100 * (task['trigger_fraction'] or 0):.0f} % of query positions are "
        f"triggers (the next token copies the one before the trigger); the others are ordinary (bigram) "
        f"positions. Uniform causal attention would put {task['uniform_bos_attn_ordinary']:.3f} on BOS from "
        f"ordinary positions and {task['uniform_bos_attn_trigger']:.3f} from trigger positions "
        f"(F-Attn {task['uniform_f_attn']:.3f}).", ""]
    missing = missing_variants(results)
    if missing:
        lines += [f"Not in these results: {', '.join(f'`{v}`' for v in missing)} (of the variants the study "
                  f"trains by default), so {'its claims are' if len(missing) == 1 else 'their claims are'} not "
                  f"judged here; a run of the study with {'it' if len(missing) == 1 else 'them'} (finished runs "
                  f"are reused) judges them.", ""]
    for depth, block in results.depths.items():
        lines += _depth_lines(depth, block, cfg, made, heading)
    lines += [
        "*Legend.* BOS attn: attention probability on BOS, averaged over heads (at the layer named above where a "
        "model has several), by query class. "
        "prev-token attn: attention of trigger positions on the token just before them (the copy). "
        "‖v‖: L2 norm of the value vector at BOS vs the mean elsewhere; ‖h‖: L2 norm of the residual stream "
        "after each layer at BOS vs elsewhere (layer mean); M-Act / median: largest |h| over the median |h| "
        "(max over layers). gate: the layer's effective gate score (product of its gates, mean over channels).",
        "",
        f"*Verdicts.* Differences count only beyond seed noise, |Δmean| > 2·√(σ₁² + σ₂²), and a figure against a "
        f"line only where the band mean ± 2σ over the seeds lies on one side of it (a line inside the band: *not "
        f"measurable*). The sink forms when the baseline puts at least {SINK_SHARE:g} of an ordinary position's "
        f"attention on BOS. A claim that a variant *removes* the sink is judged only where the baseline has one to "
        f"remove: BOS attention of ordinary positions ≥ {SINKING:g}× the uniform level; else *not measurable*. "
        f"\"Removes\" means at most {REMOVAL_RATIO:g}× the baseline's BOS attention from ordinary positions, the "
        f"factor beyond seed noise: {REMOVAL_RATIO:g}·mean_baseline − mean_variant > "
        f"2·√(σ_variant² + ({REMOVAL_RATIO:g}·σ_baseline)²). The value-state drain is "
        f"‖v_BOS‖ ≤ {DRAIN:g}× the other tokens' and the residual-state peak ‖h_BOS‖ ≥ {PEAK:g}× the others'; "
        "they *vanish* with a variant whose band lies on the other side of the line. The gate "
        "\"opens on triggers and closes elsewhere\" when its score is higher on trigger positions and the "
        "ordinary positions' score is at most half of it. The learnable sink \"takes the sink's role\" when its "
        "share of an ordinary position's attention is at least half the baseline's BOS attention (same seed) and "
        f"the BOS attention left is at most {REMOVAL_RATIO:g}× the baseline's, per seed, each beyond seed noise. "
        "The sink's share is "
        "the probability on the sink, sigmoid(b − logsumexp(q·k/√d)), read from the same scaled scores the "
        "layer computes.", ""]
    return lines


def _all_runs(results: MechanismResults) -> list[dict]:
    return [r for block in results.depths.values() for runs in block["runs"].values() for r in runs]


def write_mechanism_report(results: MechanismResults, out: str | Path) -> Path:
    """``report.md`` of a mechanism study alone, with its plots."""
    out = Path(out)
    cfg, meta = results.config, results.meta
    if meta is None:
        raise ConfigError("the mechanism part's results hold no 'meta': the study alone records its command there")
    lines = ["# gatedattn mechanism study: attention sinks at toy scale", "",
             "Models with one attention head (no q/k norm) learn the Bigram-Backcopy task (Guo et al. 2024, "
             "arXiv 2410.13835): a softmax head that must copy on trigger positions has nothing useful to do "
             "elsewhere, and may park that attention on BOS — the attention sink. A gate on the head's output "
             "can close instead; a learnable sink can take the mass instead. Every variant trains from the same "
             "seeds on the same batches.", "",
             "| | |", "|---|---|",
             f"| command | `{meta['command']}` |",
             f"| machine | {meta['machine']} |",
             f"| software | python {meta['python']}, torch {meta['torch']}, gatedattn {meta['gatedattn']} "
             f"({meta['code_version']}) |",
             f"| date | {meta['started']} · this invocation {meta['duration_min']:.1f} min; the {len(_all_runs(results))} "
             f"runs took {results.run_minutes:.1f} min summed ({cfg['workers']} at a time; finished runs are reused) |",
             f"| recipe | {MechanismConfig.from_dict(cfg).describe()}; fp32, seeds 0..{cfg['seeds'] - 1} |",
             f"| depths | {', '.join(map(str, cfg['depths']))} (deeper ones: {', '.join(cfg['deep_variants']) or 'none'}"
             f"{_deep_seeds(cfg)}) |",
             ""]
    lines += mechanism_section(results, out)
    lines += ["## Reproduce", "", "```bash", meta["command"], "```", "",
              "Every figure above comes from `results.json` beside this report.", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


def _deep_seeds(cfg: dict) -> str:
    """How many seeds the deeper depths trained (results written before ``deep_seeds``
    existed trained ``seeds`` at every depth)."""
    if len(cfg["depths"]) < 2:
        return ""
    return f", {min(cfg.get('deep_seeds', cfg['seeds']), cfg['seeds'])} seeds"


def mechanism_part(mech: MechanismResults, out: Path, heading: str) -> list[str]:
    """The mechanism study as a part of the main job (``heading``: "## Part N:"): its
    claims, tables and plots."""
    if mech.minutes is None:
        raise ConfigError("the mechanism part's results hold no 'minutes': the main job records the part's there")
    recipe = MechanismConfig.from_dict(mech.config).describe()
    lines = [f"{heading} the attention sink and its removal, on a task built to show it ({mech.minutes:.1f} min)", "",
             "One-head models learn the Bigram-Backcopy task (Guo et al. 2024): on *trigger* characters the next "
             "token copies the one before the trigger; everywhere else it is a bigram draw, so an ordinary "
             "position has nothing to attend to. A softmax head that must copy on triggers parks the other "
             "positions' attention on BOS: the attention sink. The claims below say whether it formed, whether "
             "the output gate removed it (the gate closes instead), and whether a learnable sink took its mass. "
             f"Recipe: {recipe} (chosen by the mechanism calibration, `gatedattn reproduce --study "
             "calibrate-mechanism`). Claims at several layers are judged at the baseline's strongest layer.", ""]
    lines += mechanism_section(mech, out, heading="###", title=False)
    return lines
