"""``gatedattn reproduce --study rank``: HyGA's low-rank inner width against its cost.

``hyga-lowrank`` trains once per inner width d_int in ``ReproduceConfig.ranks`` (its X-gate
rank and H-gate width both set to d_int), next to the full-rank G1 ``gated``, all on the
same batches for the same steps. Each run's validation loss is set against the gate FLOPs
of one attention layer (``gatedattn.cost``), in a table and one plot.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from gatedattn.analysis.plots import plot_loss_vs_cost

SWEPT = "hyga-lowrank"
REFERENCE = "gated"


def with_rank(cfg, d_int: int | None):
    """``cfg`` with the gate overrides of one sweep point (None: the reference, unchanged)."""
    if d_int is None:
        return cfg
    model = cfg.train.model
    gate = {**model.gate, "rank": d_int, "h_dim": d_int}
    return dataclasses.replace(cfg, train=cfg.train.replace(model=dataclasses.replace(model, gate=gate)))


def points(cfg) -> list[tuple[str, int | None]]:
    return [(REFERENCE, None), *((SWEPT, r) for r in cfg.ranks)]


def _mean_rows(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per sweep point: val loss averaged over seeds."""
    merged: dict[tuple, dict[str, Any]] = {}
    for r in sweep["rows"]:
        key = (r["variant"], r["d_int"])
        m = merged.setdefault(key, {**r, "losses": []})
        m["losses"].append(r["val_loss"])
    for m in merged.values():
        m["val_loss"] = sum(m["losses"]) / len(m["losses"])
    return list(merged.values())


def _row(r: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """One sweep point's table line, relative to the reference (NaN without one)."""
    share = r["gate_flops"] / ref["gate_flops"] if ref else math.nan
    delta = r["val_loss"] - ref["val_loss"] if ref else math.nan
    return (f"| `{r['variant']}` | {r['d_int'] if r['d_int'] is not None else 'full'} | {r['gate_flops']:,} | "
            f"{100 * share:.0f} % | {r['gate_params']:,} | {r['val_loss']:.4f} | {delta:+.4f} |")


def rank_section(results: dict[str, Any], out: Path) -> list[str]:
    """The report's section on the sweep: table and plot (nothing without a sweep)."""
    sweep = results.get("rank_sweep")
    if not sweep:
        return []
    rows = _mean_rows(sweep)
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


def lowrank_outcome(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """Per d_int: gate FLOPs as a share of G1's and the val-loss difference to it."""
    rows = _mean_rows(sweep)
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    if ref is None:
        return []
    return [{"d_int": r["d_int"], "share": r["gate_flops"] / ref["gate_flops"], "delta": r["val_loss"] - ref["val_loss"],
             "loss": r["val_loss"], "ref_loss": ref["val_loss"], "seeds": len(r["losses"])}
            for r in rows if r["variant"] == SWEPT]
