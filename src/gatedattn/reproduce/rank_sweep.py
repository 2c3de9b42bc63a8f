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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gatedattn.analysis.plots import plot_loss_vs_cost
from gatedattn.infra.errors import ConfigError
from gatedattn.data import TokenData
from gatedattn.reproduce.claims import REFERENCE, SWEPT, mean_rows
from gatedattn.reproduce.report import write_study_report
from gatedattn.reproduce.registry import Flag, list_of
from gatedattn.reproduce.text.config import FLAGS as TEXT_FLAGS, TextConfig
from gatedattn.reproduce.text.plan import plan_steps
from gatedattn.reproduce.text.run import gate_costs, run_apart, run_one
from gatedattn.infra.settings import option

NAME = "rank"  # the study's name in the registry
KEY = "rank_sweep"  # where the study's results sit in results.json
CLAIMS = ("hyga-lowrank",)


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
    rows = []
    for variant, d_int in points(cfg):
        run_cfg = dataclasses.replace(with_rank(cfg, d_int), multiples=())
        costs = gate_costs(run_cfg, data, [variant])[variant]
        for seed in range(cfg.seeds):
            tag = f"{variant}-s{seed}" + (f"-d{d_int}" if d_int is not None else "")
            run = run_one(run_cfg, data_dir, data, variant, seed, steps, out, tag=tag)
            analysis = run.get("analysis") or {}
            rows.append({"variant": variant, "d_int": d_int, "seed": seed, "steps": run["steps"],
                         "val_loss": analysis.get("val_loss", math.nan), "f_attn": analysis.get("f_attn"),
                         "diverged": run["diverged"], **costs})
    return {"steps": steps, "rows": rows}


def write_rank_report(results: dict[str, Any], out: Path) -> Path:
    return write_study_report(results, out, title="HyGA low-rank sweep", key=KEY, section=rank_section, claims=CLAIMS)


def run_rank(cfg: RankConfig, command: str | None = None) -> Path:
    """Train the sweep; write results.json and report.md; returns the report's path."""
    return run_apart(cfg, command, KEY, train_sweep, write_rank_report)


FLAGS: dict[str, Flag] = {**TEXT_FLAGS,
                          "--ranks": Flag("ranks", "hyga-lowrank inner widths d_int (default "
                                          f"{','.join(map(str, RankConfig.__dataclass_fields__['ranks'].default))})",
                                          type=list_of(int, "--ranks"))}
