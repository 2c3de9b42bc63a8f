"""How much of the first token's loss gap an arm takes back, over its data orders.

:func:`recovered` (paired: the arm's adaptation to the text taken out), :func:`unpaired`
(against the untouched model) and :func:`credited` (the smaller of the two, nothing where
the kept mode got worse): the rule no arm can game by damaging the model with the first
token present. :func:`arm_summary` gathers them over the data orders with
:func:`order_stat`, beside the correlation of each head's trained sink or gate with the
untouched model's first-token attention (:func:`on_heads`).
"""

from __future__ import annotations

import statistics
from typing import Any

from gatedattn.analysis.metrics import seed_stat
from gatedattn.reproduce.pretrained.arms import ARM_SPECS
from gatedattn.reproduce.pretrained.masked import DROPPED, KEPT
from gatedattn.reproduce.pretrained.measure import pearson


def recovered(arm: dict, untouched: dict) -> float | None:
    """1 - (arm dropped - arm kept) / (untouched dropped - untouched kept): the share of the
    first token's loss gap the arm closes, with its adaptation to the text taken out."""
    gap0 = untouched["dropped"] - untouched["kept"]
    return 1 - (arm[DROPPED]["loss"] - arm[KEPT]["loss"]) / gap0 if gap0 > 0 else None


def unpaired(arm: dict, untouched: dict) -> float | None:
    """(untouched dropped - arm dropped) / (untouched dropped - untouched kept): the share of
    the gap the arm's dropped-mode loss closes against the untouched model."""
    gap0 = untouched["dropped"] - untouched["kept"]
    return (untouched["dropped"] - arm[DROPPED]["loss"]) / gap0 if gap0 > 0 else None


def credited(arm: dict, untouched: dict, kept_tol: float) -> float | None:
    """The recovery an arm is credited with: min(paired, unpaired), and 0 where its kept-mode
    loss rose by more than ``kept_tol`` nats (an arm that damages the model with the first
    token present takes nothing back, whatever its paired figure says)."""
    paired, alone = recovered(arm, untouched), unpaired(arm, untouched)
    if paired is None or alone is None:
        return None
    if arm[KEPT]["loss"] - untouched["kept"] > kept_tol:
        return 0.0
    return min(paired, alone)


def order_stat(values: list[float | None]) -> dict[str, Any]:
    """:func:`~gatedattn.analysis.metrics.seed_stat` of the orders that have a value (a
    recovery has none in any order where the untouched model has no gap), with every
    order's value kept as it was."""
    stat = seed_stat([v for v in values if v is not None])
    return {"mean": None, "std": None, "values": values} if stat is None else {**stat, "values": values}


def arm_summary(name: str, runs: list[dict], untouched: dict, base_first: list[list[float]],
                 start: int, kept_tol: float) -> dict[str, Any]:
    """Per data order: the paired, unpaired and credited recovery and the kept-mode change;
    per (layer >= start, head) the correlation of the untouched model's first-token
    attention with the arm's sink probability / gate score."""
    out: dict[str, Any] = {"recovered": order_stat([recovered(r, untouched) for r in runs]),
                           "unpaired": order_stat([unpaired(r, untouched) for r in runs]),
                           "credited": order_stat([credited(r, untouched, kept_tol) for r in runs]),
                           "kept_change": order_stat([r[KEPT]["loss"] - untouched["kept"] for r in runs]),
                           "steps": [r["steps"] for r in runs], "converged": [r["converged"] for r in runs]}
    spec = ARM_SPECS[name]
    for key in ("sink",) if spec.sink_init else ("gate",) if spec.variant else ():
        out.update(on_heads(key, runs, base_first, start))
    return out


def on_heads(key: str, runs: list[dict], base_first: list[list[float]], start: int) -> dict[str, Any]:
    """Per data order, Pearson's r over (layer >= start, head) of the untouched model's
    first-token attention and the arm's ``key`` figure (sink probability or gate score),
    and that figure's mean; empty where a layer has none."""
    alpha = [a for layer in base_first[start:] for a in layer]
    rs = []
    for r in runs:
        per_layer = r[DROPPED]["heads"][key][start:]
        if any(v is None for v in per_layer):
            continue
        rs.append(pearson(alpha, [v for layer in per_layer for v in layer]))
    if not rs:
        return {}
    return {f"{key}_r": order_stat(rs),
            f"{key}_mean": statistics.fmean(v for r in runs for layer in r[DROPPED]["heads"][key][start:] for v in layer)}


def credit_old_results(part: dict[str, Any], kept_tol: float) -> None:
    """Results written before the credit rule (arms without ``credited``) get it, applied
    to the held-out losses each run kept, with ``kept_tol`` recorded in their config as the
    tolerance it was judged with."""
    arms = part.get("arms", {})
    if not any("credited" not in a for a in arms.values()):
        return
    kept_tol = part["config"].setdefault("kept_tol", kept_tol)
    for a in arms.values():
        a["credited"] = order_stat([credited(r, part["untouched"], kept_tol) for r in a["runs"]])
