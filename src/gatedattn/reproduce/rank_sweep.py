"""``gatedattn reproduce --study rank``: HyGA's low-rank inner width against its cost.

``hyga-lowrank`` trains once per inner width d_int in ``RankConfig.ranks`` (its X-gate
rank and H-gate width both set to d_int), next to the full-rank G1 ``gated``, all on the
same batches for the same steps. Each run's validation loss is set against the gate FLOPs
of one attention layer (``gatedattn.cost``), in a table and one plot. The claim it
settles is HyGA's "low-rank gates cost a fraction of G1's with no loss penalty"
(``hyga-lowrank`` in :mod:`gatedattn.reproduce.claims`); its results fold into the main
job's report with ``gatedattn reproduce --fold DIR``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gatedattn import paper as P
from gatedattn.analysis.plots import plot_loss_vs_cost
from gatedattn.infra.errors import ConfigError
from gatedattn.data import TokenData
from gatedattn.reproduce.study_report import write_study_report
from gatedattn.reproduce.verdicts import HELD, NOT_HELD, NOT_MEASURABLE, Verdict, Claim, compare, summary_metric
from gatedattn.reproduce.batch import run_batch
from gatedattn.reproduce.registry import Flag, list_of
from gatedattn.reproduce.text.config import FLAGS as TEXT_FLAGS, TextConfig
from gatedattn.reproduce.text.plan import plan_steps
from gatedattn.reproduce.text.run import gate_costs, run_apart, text_run
from gatedattn.infra.settings import option

NAME = "rank"  # the study's name in the registry
KEY = "rank_sweep"  # where the study's results sit in results.json
SWEPT, REFERENCE = "hyga-lowrank", "gated"  # the rank sweep's swept variant and its full-rank reference


@dataclass(frozen=True)
class RankConfig(TextConfig):
    """The rank sweep: the natural-text recipe of :class:`TextConfig` for the full-rank
    ``gated`` reference and ``hyga-lowrank`` at each inner width of ``ranks``."""

    STUDY: ClassVar[str] = NAME

    variants: tuple[str, ...] = option((REFERENCE, SWEPT), choices=(REFERENCE, SWEPT),
                                       help="the reference and the swept variant (both are always trained)")
    out_dir: str = option("runs/reproduce-rank", help="output directory")
    ranks: tuple[int, ...] = option((8, 16, 32, 64), gt=0, help="inner widths d_int of hyga-lowrank")

    def __post_init__(self) -> None:
        if not self.ranks or any(not isinstance(r, int) for r in self.ranks):
            raise ConfigError(f"RankConfig.ranks={self.ranks} must be one or more positive integers")
        super().__post_init__()


def with_rank(cfg: RankConfig, d_int: int | None) -> RankConfig:
    """``cfg`` with the gate overrides of one sweep point (None: the reference, unchanged)."""
    if d_int is None:
        return cfg
    model = cfg.train.model
    gate = {**model.gate, "rank": d_int, "h_dim": d_int}
    return dataclasses.replace(cfg, train=cfg.train.replace(model=dataclasses.replace(model, gate=gate)))


def points(cfg: RankConfig) -> list[tuple[str, int | None]]:
    return [(REFERENCE, None), *((SWEPT, r) for r in cfg.ranks)]


def _row(r: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """One sweep point's table line, relative to the reference (NaN without one)."""
    share = r["gate_flops"] / ref["gate_flops"] if ref else math.nan
    delta = r["val_loss"] - ref["val_loss"] if ref else math.nan
    return (f"| `{r['variant']}` | {r['d_int'] if r['d_int'] is not None else 'full'} | {r['gate_flops']:,} | "
            f"{100 * share:.0f} % | {r['gate_params']:,} | {r['val_loss']:.4f} | {delta:+.4f} |")


def rank_section(results: dict[str, Any], out: Path) -> list[str]:
    """The report's section on the sweep: table and plot (nothing without a sweep)."""
    sweep = results.get(KEY)
    if not sweep:
        return []
    rows = mean_rows(sweep)
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    lines = ["## HyGA low-rank width: loss against gate cost", "",
             f"`{SWEPT}` at each inner width d_int (X-gate rank and H-gate width), next to full-rank G1 `{REFERENCE}`; "
             f"{sweep['steps']} steps each on the same batches. Gate FLOPs are per attention layer and sequence.", "",
             "| variant | d_int | gate FLOPs | share of G1's | gate params | val loss | Δ loss vs gated |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [_row(r, ref) for r in rows] + [""]
    series = {f"{SWEPT}": [(r["gate_flops"], r["val_loss"], f"d_int {r['d_int']}") for r in rows if r["variant"] == SWEPT]}
    if ref:
        series[REFERENCE] = [(ref["gate_flops"], ref["val_loss"], "G1 elementwise")]
    plot_loss_vs_cost(series, Path(out) / "rank_sweep.png")
    return lines + ["![rank_sweep](rank_sweep.png)", ""]


def train_sweep(cfg: RankConfig, data_dir: Path, data: TokenData, out: Path) -> dict[str, Any]:
    """Train every sweep point for the same steps; the rows of the sweep."""
    steps, _ = plan_steps(cfg, data, cfg.seeds, counts={REFERENCE: 1, SWEPT: len(cfg.ranks)})
    runs, meta = [], []
    for variant, d_int in points(cfg):
        run_cfg = dataclasses.replace(with_rank(cfg, d_int), multiples=())
        costs = gate_costs(run_cfg, data, [variant])[variant]
        for seed in range(cfg.seeds):
            tag = f"{variant}-s{seed}" + (f"-d{d_int}" if d_int is not None else "")
            runs.append(text_run(run_cfg, data_dir, data, variant, seed, steps, out, tag=tag))
            meta.append({"variant": variant, "d_int": d_int, "seed": seed, "costs": costs})
    rows = []
    for m, run in zip(meta, run_batch(runs)):
        analysis = run.get("analysis") or {}
        rows.append({"variant": m["variant"], "d_int": m["d_int"], "seed": m["seed"], "steps": run["steps"],
                     "val_loss": analysis.get("val_loss", math.nan), "f_attn": analysis.get("f_attn"),
                     "diverged": run["diverged"], **m["costs"]})
    return {"steps": steps, "rows": rows}


def write_rank_report(results: dict[str, Any], out: Path) -> Path:
    return write_study_report(results, out, title="HyGA low-rank sweep", key=KEY, section=rank_section, claims=(LOWRANK,))


def run_rank(cfg: RankConfig, command: str | None = None) -> Path:
    """Train the sweep; write results.json and report.md; returns the report's path."""
    return run_apart(cfg, command, KEY, train_sweep, write_rank_report)



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
    main = summary_metric(results, "gated", "val_loss")
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
    if results.get(KEY):
        return _lowrank_sweep(results, results[KEY])
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


LOWRANK = Claim("hyga-lowrank", "HyGA",
                "Low-rank HyGA costs a fraction of the G1 gate with no loss penalty",
          f"d_int {P.HYGA_LOWRANK[0]}: {100 * P.HYGA_LOWRANK[1]:.0f} % of gate compute, slightly better loss", _lowrank_cost)
CLAIMS = (LOWRANK.key,)  # the claims its results settle

FLAGS: dict[str, Flag] = {**TEXT_FLAGS,
                          "--ranks": Flag("ranks", "hyga-lowrank inner widths d_int (default "
                                          f"{','.join(map(str, RankConfig.__dataclass_fields__['ranks'].default))})",
                                          type=list_of(int, "--ranks"))}
