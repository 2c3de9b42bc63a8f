"""``gatedattn reproduce --study calibrate-mechanism``: which recipe grows the full
Bigram-Backcopy sink, and does the gate remove it under every recipe that grows one?

Each *lever* is one change to the mechanism study's default recipe
(:class:`~gatedattn.reproduce.mechanism.config.MechanismConfig`): position encoding, norm, q/k/v
bias, tied embeddings and their initial scale, width, tokens per step, a fresh stream vs
re-read windows, learning rate and schedule, beta2, weight decay, clipping. Every lever
trains ``baseline``, ``gated`` and ``sink`` at one layer for the same steps on the same
batches, and records BOS attention (and the gate score) along training. The
``finalists`` (the levers whose baseline sink is largest, plus the default) get
``finalist_seeds`` seeds; the others one.

The default recipe is chosen by the baseline's sink alone (its BOS attention at the
end, and how early it passes 0.5), never by what the gate does; the gate's effect is
then judged on every lever whose baseline forms a sink (at least ``SINKING``
times the uniform level): gated / baseline BOS attention per lever, and how many of the
sinking levers it removed the sink in (at most half of the baseline's).

Layout of ``out``::

    out/results.json, out/report.md, out/*.png
    out/data-<tokens>/                the generated task, one per stream length
    out/levers/<lever>/runs/<variant>-L1-s<seed>/   each run (reused by a second call)
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatedattn.analysis import plots
from gatedattn.analysis.metrics import seed_stat
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fmt import fmt_mean_std
from gatedattn.infra.io import atomic_write_json, atomic_write_text, json_safe
from gatedattn.infra.provenance import run_meta, say
from gatedattn.reproduce.mechanism.claims import REMOVAL_RATIO, SINK_SHARE, SINKING
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.mechanism.run import ensure_task_data, mechanism_run
from gatedattn.infra.settings import build, check_options, option
from gatedattn.reproduce.batch import run_batch
from gatedattn.reproduce.registry import Flag, list_of, out_flag, quiet_flag

NAME = "calibrate-mechanism"  # the study's name in the registry
VARIANTS = ("baseline", "gated", "sink")
ANCHOR = ("Guo et al.'s own Bigram-Backcopy runs (1 layer, d_model 256, learned positions, LayerNorm, untied "
          "N(0, 1) embeddings, AdamW (0.9, 0.99), constant LR 3e-4, 512 x 256 fresh tokens a step) reach BOS "
          "attention 0.5 at step 260, about 34 M tokens")


@dataclass(frozen=True)
class MechLever:
    """One recipe change: ``changes`` are MechanismConfig fields."""

    name: str
    what: str
    changes: tuple[tuple[str, Any], ...] = ()


def _lever(name: str, what: str, **changes: Any) -> MechLever:
    return MechLever(name, what, tuple(changes.items()))


LEVERS: tuple[MechLever, ...] = (
    _lever("default", "the default recipe (learned positions, LayerNorm, q/k/v bias, untied N(0, 1) embeddings, "
                      "d 64, 32 x 64 tokens, LR 3e-3 constant, beta2 0.99, WD 1e-4, no clipping, fresh stream)"),
    _lever("rope", "full RoPE instead of learned positions", positions="rope"),
    _lever("partial-rope", "half the channels rotate (RoPE 0.5) instead of learned positions", positions="partial-rope"),
    _lever("rmsnorm", "RMSNorm instead of LayerNorm", norm="rms"),
    _lever("no-qkv-bias", "no q/k/v biases", qkv_bias=False),
    _lever("tied", "tied embeddings", tie_embeddings=True),
    _lever("embed-0.02", "embeddings drawn from N(0, 0.02) (the other matrices' scale)", embed_std=0.02),
    _lever("width-128", "d_model 128", d_model=128),
    _lever("width-256", "d_model 256 (the reference's width)", d_model=256),
    _lever("batch-8", "8 sequences a step (a quarter of the tokens)", micro_batch=8),
    _lever("batch-128", "128 sequences a step (4x the tokens)", micro_batch=128),
    _lever("stream-64k", "windows of one 64 k-token stream, re-read (not fresh text)", train_tokens=1 << 16),
    _lever("lr-3e-4", "LR 3e-4 (the reference's)", lr=3e-4),
    _lever("lr-1e-3", "LR 1e-3", lr=1e-3),
    _lever("cosine", "cosine decay to a tenth instead of a constant LR", schedule="cosine"),
    _lever("beta2-0.95", "AdamW beta2 0.95", beta2=0.95),
    _lever("wd-0.1", "weight decay 0.1", weight_decay=0.1),
    _lever("clip-1", "gradient clipping at 1.0", grad_clip=1.0),
)
LEVER_NAMES = tuple(lv.name for lv in LEVERS)
QUICK_LEVERS = ("default", "rope")


@dataclass(frozen=True)
class MechCalibrationConfig:
    """A calibration of the mechanism recipe (see the module docstring)."""

    levers: tuple[str, ...] = option(LEVER_NAMES, choices=LEVER_NAMES, help="levers to measure (names from LEVERS)")
    steps: int = option(1200, gt=0, help="optimizer steps of every run")
    evals: int = option(12, gt=0, help="measurements along training")
    finalists: int = option(3, ge=0, help="levers besides the default that get finalist_seeds seeds (largest sinks)")
    finalist_seeds: int = option(3, gt=0, help="seeds of the default and the finalists")
    workers: int = option(2, gt=0, help="runs trained at a time (one thread each)")
    out_dir: str = option("runs/reproduce-calibrate-mechanism", help="output directory")
    quick_recipe: bool = option(False, help="every lever with small batches and stream (the --quick smoke run)")
    progress: bool = option(True, help="progress messages")

    def __post_init__(self) -> None:
        object.__setattr__(self, "levers", tuple(self.levers))
        check_options(self)
        if not self.levers:
            raise ConfigError(f"MechCalibrationConfig.levers is empty; choose from {', '.join(LEVER_NAMES)}")

    @classmethod
    def quick(cls, **changes: Any) -> "MechCalibrationConfig":
        base = dict(levers=QUICK_LEVERS, steps=60, evals=2, finalists=0, finalist_seeds=1, workers=1, quick_recipe=True,
                    out_dir="runs/reproduce-calibrate-mechanism-quick")
        return cls(**{**base, **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MechCalibrationConfig":
        return build(cls, data)

    def lever_config(self, lever: MechLever, seeds: int) -> MechanismConfig:
        base = MechanismConfig(variants=VARIANTS, depths=(1,), deep_variants=(), seeds=seeds, steps=self.steps,
                               evals=self.evals, workers=1, progress=False)
        if self.quick_recipe:  # the smoke run: small batches, a small stream and a short measurement
            base = base.replace(micro_batch=8, train_tokens=1 << 16, analysis_sequences=16, warmup_steps=10)
        return base.replace(**dict(lever.changes))

    def chosen(self) -> list[MechLever]:
        return [lv for lv in LEVERS if lv.name in self.levers]


# ------------------------------------------------------------------------------ training
def _train(cfg: MechCalibrationConfig, out: Path, jobs: list[tuple[MechLever, int]]) -> dict[str, list[dict]]:
    """Train (or reuse) every (lever, seed) job's three variants; records by lever name."""
    runs, names, data_dirs = [], [], {}  # one generated stream per length, shared by the levers
    for lever, seed in jobs:
        lcfg = cfg.lever_config(lever, seeds=seed + 1)
        if lcfg.train_tokens not in data_dirs:
            data_dirs[lcfg.train_tokens] = ensure_task_data(lcfg, out / f"data-{lcfg.train_tokens}")
        for v in VARIANTS:
            runs.append(mechanism_run(lcfg, data_dirs[lcfg.train_tokens], out / "levers" / lever.name, v, 1, seed,
                                      name=f"{lever.name}/{v}-L1-s{seed}"))
            names.append(lever.name)
    if cfg.progress:
        say(NAME, f"calibration: {len(runs)} runs of {cfg.steps} steps ({cfg.workers} at a time) in {out}")

    def progress(i: int, record: dict) -> str:
        return (f"{names[i]}: {record['variant']} seed {record['seed']} BOS attention "
                f"{record['final']['bos_attn_ordinary']:.3f}")

    records: dict[str, list[dict]] = {}
    found = run_batch(runs, workers=cfg.workers, threads=1, label=NAME,
                      progress=progress if cfg.progress else None)
    for name, record in zip(names, found):
        records.setdefault(name, []).append(record)
    return records


def _crossing(curve: dict[str, list], tokens_per_step: int, level: float) -> int | None:
    """Tokens seen when the curve's BOS attention first reaches ``level`` (None: never)."""
    for step, value in zip(curve["step"], curve["bos_attn_ordinary"]):
        if value is not None and value >= level:
            return step * tokens_per_step
    return None


FINAL_KEYS = ("bos_attn_ordinary", "sink_mass_ordinary", "gate_ordinary", "gate_trigger", "value_norm_bos",
              "value_norm_other", "resid_norm_bos", "resid_norm_other", "uniform_bos_attn_ordinary")
CURVE_KEYS = ("bos_attn_ordinary", "gate_ordinary", "gate_trigger", "sink_mass_ordinary")


def _final_stats(by_variant: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Per variant that ran: each final measurement over seeds."""
    return {v: {k: seed_stat([r["final"].get(k) for r in runs]) for k in FINAL_KEYS}
            for v, runs in by_variant.items() if runs}


def _token_curves(by_variant: dict[str, list[dict]], tokens_per_step: int) -> dict[str, list[dict]]:
    """Per variant and seed: the curves against tokens seen."""
    def one(curve: dict[str, list]) -> dict[str, list]:
        return {"tokens": [s * tokens_per_step for s in curve["step"]], **{k: curve.get(k) for k in CURVE_KEYS}}

    return {v: [one(r["curve"]) for r in runs] for v, runs in by_variant.items()}


def lever_row(lever: MechLever, lcfg: MechanismConfig, records: list[dict]) -> dict[str, Any]:
    """One lever's figures: per variant the final measurements (mean, std, per seed), the
    baseline's tokens to BOS attention 0.5, the removal ratios and curves."""
    by_variant = {v: sorted((r for r in records if r["variant"] == v), key=lambda r: r["seed"]) for v in VARIANTS}
    fin = _final_stats(by_variant)
    base = fin["baseline"]
    uniform = base["uniform_bos_attn_ordinary"]["mean"]
    tps = lcfg.micro_batch * lcfg.seq_len
    sinking = base["bos_attn_ordinary"]["mean"] >= SINKING * uniform

    def ratio(variant: str, key: str = "bos_attn_ordinary") -> float | None:
        other = fin.get(variant, {}).get(key)
        return _ratio(other, base["bos_attn_ordinary"]) if other else None

    gated = ratio("gated")
    return {
        "lever": lever.name, "what": lever.what, "changes": dict(lever.changes), "seeds": len(by_variant["baseline"]),
        "tokens": lcfg.tokens_per_run(), "uniform": uniform, "final": fin, "sinking": sinking,
        "tokens_to_half": [_crossing(r["curve"], tps, SINK_SHARE) for r in by_variant["baseline"]],
        "gated_ratio": gated, "sink_ratio": ratio("sink"), "sink_mass_ratio": ratio("sink", "sink_mass_ordinary"),
        "drain": _ratio(base["value_norm_bos"], base["value_norm_other"]),
        "peak": _ratio(base["resid_norm_bos"], base["resid_norm_other"]),
        "removed": sinking and gated is not None and gated <= REMOVAL_RATIO,
        "curves": _token_curves(by_variant, tps),
        "wall_seconds": sum(r["wall_seconds"] for r in records),
    }


def _ratio(a: dict | None, b: dict | None) -> float | None:
    return a["mean"] / b["mean"] if a and b and b["mean"] else None


def pick_finalists(rows: dict[str, dict], n: int) -> list[str]:
    """The ``n`` levers (besides the default) with the largest baseline BOS attention at the
    end; ties by the earliest crossing of 0.5."""
    def key(name: str) -> tuple[float, float]:
        row = rows[name]
        cross = [c for c in row["tokens_to_half"] if c is not None]
        return (-row["final"]["baseline"]["bos_attn_ordinary"]["mean"], min(cross) if cross else math.inf)

    return sorted((n_ for n_ in rows if n_ != "default"), key=key)[:n]


def _finalists(cfg: MechCalibrationConfig, out: Path, levers: dict[str, MechLever], rows: dict[str, dict],
               records: dict[str, list[dict]]) -> list[str]:
    """Train the default and the finalists' further seeds; update their rows; their names."""
    if cfg.finalist_seeds <= 1:
        return []
    finalists = [n for n in ("default",) if n in levers] + pick_finalists(rows, cfg.finalists)
    more = _train(cfg, out, [(levers[n], s) for n in finalists for s in range(1, cfg.finalist_seeds)])
    for n in finalists:
        rows[n] = lever_row(levers[n], cfg.lever_config(levers[n], cfg.finalist_seeds), records[n] + more.get(n, []))
    return finalists


def run_mechanism_calibration(cfg: MechCalibrationConfig, command: str | None = None) -> Path:
    """Train every lever (one seed), then the default and the finalists with more seeds;
    write the table, plots and report; returns report.md."""
    started = time.time()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    levers = {lv.name: lv for lv in cfg.chosen()}
    records = _train(cfg, out, [(lv, 0) for lv in levers.values()])
    rows = {n: lever_row(levers[n], cfg.lever_config(levers[n], 1), records[n]) for n in levers}
    finalists = _finalists(cfg, out, levers, rows, records)
    results = {"study": NAME, "config": dataclasses.asdict(cfg), "finalists": finalists,
               "rows": list(rows.values()), "anchor": ANCHOR,
               "recipe": cfg.lever_config(LEVERS[0], cfg.finalist_seeds).describe(),
               "meta": run_meta(command or f"gatedattn reproduce --study {NAME}", started)}
    atomic_write_json(out / "results.json", json_safe(results))
    return write_mechanism_calibration_report(results, out)


# ------------------------------------------------------------------------------ report
def _mean_curve(runs: list[dict], key: str) -> tuple[list[float], list[float]]:
    """The seed-mean of one curve (seeds share their measurement steps)."""
    x = runs[0]["tokens"]
    ys = [[v if v is not None else math.nan for v in r[key]] for r in runs if r.get(key)]
    if not ys:
        return [], []
    return x, [sum(col) / len(col) for col in zip(*ys)]


def _calibration_plots(rows: list[dict[str, Any]], out: Path) -> list[tuple[str, str]]:
    """The curves per lever and the removal ratios of the sinking levers; (caption, file)."""
    with_gate = [r for r in rows if r["curves"].get("gated")]
    bos = {r["lever"]: _mean_curve(r["curves"]["baseline"], "bos_attn_ordinary") for r in rows}
    gated = {r["lever"]: _mean_curve(r["curves"]["gated"], "bos_attn_ordinary") for r in with_gate}
    gate = {r["lever"]: _mean_curve(r["curves"]["gated"], "gate_ordinary") for r in with_gate}
    half = {SINK_SHARE: f"BOS attention {SINK_SHARE:g}"}
    plots.plot_panels_over_tokens(
        [("baseline: BOS attention, ordinary positions", "attention on BOS", bos, half),
         ("gated: BOS attention, ordinary positions", "attention on BOS", gated, half),
         ("gated: gate score, ordinary positions", "mean gate score", gate, {})],
        out / "calibration_curves.png", "Mechanism recipe levers over training (seed means)")
    made = [("BOS attention and gate score over training, per lever", "calibration_curves.png")]
    return made + _removal_plot([r for r in rows if r["sinking"]], out)


def _removal_plot(sinking: list[dict[str, Any]], out: Path) -> list[tuple[str, str]]:
    """Gated / baseline and sink / baseline BOS attention per sinking lever (none: no plot)."""
    if not sinking:
        return []
    plots.plot_ratio_bars(
        {"gated / baseline": {r["lever"]: r["gated_ratio"] for r in sinking},
         "sink / baseline": {r["lever"]: r["sink_ratio"] for r in sinking}},
        out / "removal_ratio.png", "BOS attention of ordinary positions relative to the baseline, sinking levers",
        "ratio to the baseline's BOS attention", threshold=REMOVAL_RATIO)
    return [("Removal ratio per sinking lever", "removal_ratio.png")]


def write_mechanism_calibration_report(results: dict[str, Any], out: Path) -> Path:
    rows = results["rows"]
    made = _calibration_plots(rows, out)
    sinking = [r for r in rows if r["sinking"]]
    meta, cfg = results["meta"], results["config"]
    n_removed = sum(r["removed"] for r in sinking)
    lines = [
        "# Mechanism recipe calibration: when does the full Bigram-Backcopy sink form, and does the gate remove it?",
        "", f"Each lever changes one thing in the default recipe ({results['recipe']}) and trains `baseline`, `gated` "
            f"and `sink` at one layer on the same batches. The default and the finalists "
            f"({', '.join(results['finalists']) or 'none'}) ran {cfg['finalist_seeds']} seeds, the other levers one. "
            f"The default recipe is chosen by the baseline's sink alone; the gate is judged on every lever whose "
            f"baseline BOS attention reaches {SINKING:g}x the uniform level.", "",
        f"For scale: {results['anchor']}.", "",
        f"**The gate removed the sink (gated <= {REMOVAL_RATIO:g}x the baseline's BOS attention) in {n_removed} of "
        f"{len(sinking)} sinking levers.**", "",
        "| lever | change | seeds | baseline BOS attn | x uniform | tokens to 0.5 | ‖v_BOS‖/‖v‖ | ‖h_BOS‖/‖h‖ "
        "| gated BOS attn | gated / baseline | sink BOS attn | sink / baseline | sink mass | gate ord. / trig. |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_table_row(r) for r in rows]
    lines += ["", f"Uniform causal attention puts {rows[0]['uniform']:.3f} on BOS from ordinary positions. "
                  "‖v_BOS‖/‖v‖: the value-state drain (BOS's value vector against the others'); ‖h_BOS‖/‖h‖: the "
                  "residual-state peak (the residual stream after the layer at BOS against elsewhere); both the "
                  "baseline's. ✓: the gate removed the sink on that lever. Figures are at the end of training, "
                  "on 256 sequences drawn apart from the training data; tokens to 0.5 per seed, at the resolution "
                  f"of the {cfg['evals']} measurements along training.", ""]
    lines += [f"![{what}]({file})\n" for what, file in made]
    lines += ["## Reproduce", "", "```bash", meta["command"], "```", "",
              f"Machine: {meta['machine']}. The runs took {sum(r['wall_seconds'] for r in rows) / 60:.1f} min "
              f"summed, one thread each, {cfg['workers']} at a time; a second call reuses them (this invocation: "
              f"{meta['duration_min']:.1f} min).", ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))


def _table_row(r: dict[str, Any]) -> str:
    """One lever's line of the calibration table."""
    f = r["final"]
    cross_text = ", ".join("never" if c is None else f"{c / 1e6:.2f} M" for c in r["tokens_to_half"])
    gated, sink = f.get("gated", {}), f.get("sink", {})
    gate_text = (f"{gated['gate_ordinary']['mean']:.2f} / {gated['gate_trigger']['mean']:.2f}"
                 if gated.get("gate_ordinary") and gated.get("gate_trigger") else "–")
    return (f"| `{r['lever']}` | {r['what']} | {r['seeds']} | {fmt_mean_std(f['baseline']['bos_attn_ordinary'])} | "
            f"{f['baseline']['bos_attn_ordinary']['mean'] / r['uniform']:.1f} | {cross_text} | {_num(r['drain'])} | "
            f"{_num(r['peak'])} | {fmt_mean_std(gated.get('bos_attn_ordinary'))} | "
            f"{_num(r['gated_ratio'])}{' ✓' if r['removed'] else ''} | {fmt_mean_std(sink.get('bos_attn_ordinary'))} | "
            f"{_num(r['sink_ratio'])} | {fmt_mean_std(sink.get('sink_mass_ordinary'))} | {gate_text} |")


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


FLAGS: dict[str, Flag] = {
    "--levers": Flag("levers", "levers to measure (default all; an unknown name lists them)",
                     type=list_of(str, "--levers")),
    "--steps": Flag("steps", "", type=int), "--workers": Flag("workers", "", type=int), "--out": out_flag(),
    "--quiet": quiet_flag(),
}
