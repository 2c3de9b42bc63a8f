"""The measurements of the real-model study that need no training: the sink as it is
(:func:`sink_figures`, through :func:`gatedattn.analysis.analyze`), the loss lost
without the first position, as a curve over the attention window (:func:`noop_curve`),
and per position over one long text (:func:`streaming_curves`)."""

from __future__ import annotations

import math
import statistics

import torch
from torch import Tensor

from gatedattn.analysis import analyze
from gatedattn.models.lm import GatedLM
from gatedattn.reproduce.pretrained.masked import DROPPED, KEPT, position_losses, window_losses

STREAM_BIN = 16  # positions per point of the streaming curve

# the analysis keys the report reads (the rest of analyze's result stays out of results.json)
SINK_KEYS = ("f_attn", "f_attn_per_layer", "f_attn_per_head", "sink_eps", "sink_eps_per_layer", "sink_alpha", "eps",
             "value_drain_per_layer", "value_drain_per_head", "residual_peak_per_layer", "m_act", "m_act_per_layer",
             "m_act_ratio", "m_act_ratio_max", "m_act_ratio_per_layer", "m_act_layer", "m_act_channels", "val_loss",
             "first_token", "windows", "seq_len", "n_tokens")


def sink_figures(model: GatedLM, rows: Tensor, first_token=None) -> dict:
    """``analyze``'s sink, value-drain, residual-peak and massive-activation figures of
    ``model`` on the window rows (N, T + 1), per layer and head."""
    result = analyze(model, list(rows.split(4)), first_token=first_token)
    return {k: result.get(k) for k in SINK_KEYS}


def gap(kept: Tensor, dropped: Tensor) -> dict:
    """Mean kept and dropped loss and their paired gap with its standard error over windows."""
    diff = (dropped - kept).double()
    se = diff.std(unbiased=True).item() / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return {"kept": kept.mean().item(), "dropped": dropped.mean().item(), "gap": diff.mean().item(), "gap_se": se,
            "windows": len(diff)}


def noop_point(model: GatedLM, rows: Tensor, window: int) -> dict:
    """The loss with the first position in every query's view and without it, at ``window``
    (0: full causal attention, where keeping it is the model as it is)."""
    kept = window_losses(model, rows, window, KEPT if window else "free")
    dropped = window_losses(model, rows, window, DROPPED)
    return {"window": window, **gap(kept, dropped)}


def noop_curve(model: GatedLM, rows: Tensor, windows: tuple[int, ...]) -> list[dict]:
    """:func:`noop_point` at full attention and at every window, widest first."""
    return [noop_point(model, rows, w) for w in (0, *sorted(windows, reverse=True))]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of two equally long lists (None when either is constant)."""
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    den = (x.norm() * y.norm()).item()
    return (x @ y).item() / den if den > 0 else None


def bins(losses: Tensor) -> list[float]:
    """A per-position loss curve (T,) as the means of STREAM_BIN positions."""
    return [losses[b:b + STREAM_BIN].mean().item() for b in range(0, len(losses), STREAM_BIN)]


def streaming_curves(model: GatedLM, row: Tensor, window: int) -> dict:
    """Per-position loss over one long held-out window (binned by STREAM_BIN): full
    attention, window W with the first token kept and dropped (each arm's curve, dropped,
    comes from its first data order)."""
    curves = {"full": position_losses(model, row, 0, "free"), "kept": position_losses(model, row, window, KEPT),
              "dropped": position_losses(model, row, window, DROPPED)}
    n = row.shape[1] - 1
    return {"window": window, "tokens": n, "bin": STREAM_BIN,
            "positions": [b + STREAM_BIN / 2 for b in range(0, n, STREAM_BIN)],
            "curves": {k: bins(v) for k, v in curves.items()}}


def streaming_late(s: dict) -> dict[str, float]:
    """The mean loss of each streaming curve over the bins past the window (where every query's
    view has slid past the first token)."""
    skip = -(-s["window"] // s["bin"])  # the bins that hold positions below W
    return {k: statistics.fmean(v[skip:]) for k, v in s["curves"].items() if len(v) > skip}
