"""Pure metric functions for attention sinks, massive activations, gates and training runs.

Definitions follow docs/design.md section 4. Nothing here touches a model: callers collect tensors
through hooks and pass them in. Streaming accumulators (``AttentionStats``, ``GateStats``) keep
float64 sums and integer counts, so many small updates give the same result as one big batch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from gatedattn.train.divergence import DIVERGE_FACTOR, first_divergence

__all__ = [
    "AttentionStats",
    "FirstPositionNorms",
    "GateStats",
    "GateSummary",
    "MassiveActivation",
    "Stat",
    "TopActivations",
    "differs_beyond_noise",
    "diverged",
    "first_token_attention",
    "first_token_attention_per_head",
    "first_position_norm_ratio",
    "gate_statistics",
    "loss_spikes",
    "massive_activation",
    "mean_std",
    "seed_stat",
    "sink_fraction",
    "sink_fraction_per_layer",
    "sink_scores",
]

SINK_EPS = 0.3  # Gu et al. (ICLR 2025): a head is a sink head when alpha > 0.3
GATE_THRESHOLDS = (0.01, 0.001)  # docs/design.md section 4: fraction of gate scores below these


# --------------------------------------------------------------------------- attention


def _first_key_column(probs: Tensor) -> Tensor:
    """Check ``probs`` is (B, H, T, T) and return A[:, :, :, 0] as float64, shape (B, H, T)."""
    if probs.dim() != 4 or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(f"attention probs must be (B, H, T, T); got shape {tuple(probs.shape)}")
    return probs[..., 0].detach().to(torch.float64)


def first_token_attention_per_head(probs: Tensor) -> Tensor:
    """Per-head F-Attn of one layer.

    probs: (B, H, T, T) attention probabilities (rows = queries). Rows may sum to less than 1
    when a learnable sink takes mass; only the probability on key 0 is read.
    Returns (H,) float64: mean of A[b, h, i, 0] over batch and queries i = 1..T-1
    (query 0 is excluded: it can only attend to key 0). NaN when T == 1.
    """
    col0_BHT = _first_key_column(probs)
    if col0_BHT.shape[-1] < 2:
        return torch.full((col0_BHT.shape[1],), math.nan, dtype=torch.float64)
    return col0_BHT[..., 1:].mean(dim=(0, 2)).cpu()


def first_token_attention(probs: Tensor) -> float:
    """F-Attn of one layer: probability on key 0, averaged over batch, heads and queries 1..T-1.

    probs: (B, H, T, T). Returns a float (NaN when T == 1).
    """
    return float(first_token_attention_per_head(probs).mean())


def sink_scores(probs: Tensor) -> Tensor:
    """Per-head sink score alpha (Gu et al., ICLR 2025) of one layer.

    probs: (B, H, T, T). alpha_h = mean of A[b, h, i, 0] over batch and all queries i >= 0.
    Returns (H,) float64.
    """
    return _first_key_column(probs).mean(dim=(0, 2)).cpu()


def _alphas_by_layer(alphas_per_layer: Sequence[Tensor]) -> list[Tensor]:
    if len(alphas_per_layer) == 0:
        raise ValueError("sink_fraction needs at least one layer of alphas")
    return [torch.as_tensor(a).detach().reshape(-1).cpu() for a in alphas_per_layer]


def sink_fraction_per_layer(alphas_per_layer: Sequence[Tensor], eps: float = SINK_EPS) -> list[float]:
    """Per layer, the fraction of heads with alpha > eps. alphas_per_layer: L tensors of shape (H,)."""
    return [float((a > eps).double().mean()) for a in _alphas_by_layer(alphas_per_layer)]


def sink_fraction(alphas_per_layer: Sequence[Tensor], eps: float = SINK_EPS) -> float:
    """Sink^eps: fraction of all (layer, head) pairs with alpha > eps (layers may differ in H)."""
    all_alphas = torch.cat(_alphas_by_layer(alphas_per_layer))
    return float((all_alphas > eps).double().mean())


class AttentionStats:
    """Streaming F-Attn and sink alpha for one layer over many batches.

    Keeps per-head float64 sums of A[., h, i, 0] and query counts, so the result equals the
    single-call functions on the batches concatenated along B. Batches may differ in T; each
    query then counts once (a query-weighted mean).
    """

    def __init__(self) -> None:
        self._first_sum: Tensor | None = None  # (H,) sum over queries i >= 1
        self._first_count = 0  # queries i >= 1 seen per head
        self._alpha_sum: Tensor | None = None  # (H,) sum over queries i >= 0
        self._alpha_count = 0  # queries i >= 0 seen per head

    def update(self, probs: Tensor) -> None:
        """Add one batch of attention probabilities, (B, H, T, T)."""
        col0_BHT = _first_key_column(probs)
        B, H, T = col0_BHT.shape
        if self._alpha_sum is not None and self._alpha_sum.shape[0] != H:
            raise ValueError(f"AttentionStats saw {self._alpha_sum.shape[0]} heads before, now {H}")
        first = col0_BHT[..., 1:].sum(dim=(0, 2)).cpu()
        alpha = col0_BHT.sum(dim=(0, 2)).cpu()
        self._first_sum = first if self._first_sum is None else self._first_sum + first
        self._alpha_sum = alpha if self._alpha_sum is None else self._alpha_sum + alpha
        self._first_count += B * (T - 1)
        self._alpha_count += B * T

    def _mean(self, total: Tensor | None, count: int) -> Tensor:
        if total is None:
            raise ValueError("AttentionStats has no data; call update() first")
        return total / count if count > 0 else torch.full_like(total, math.nan)

    def first_token_attention_per_head(self) -> Tensor:
        """(H,) F-Attn per head over everything seen."""
        return self._mean(self._first_sum, self._first_count)

    def first_token_attention(self) -> float:
        """F-Attn of the layer over everything seen."""
        return float(self.first_token_attention_per_head().mean())

    def sink_scores(self) -> Tensor:
        """(H,) sink alpha per head over everything seen."""
        return self._mean(self._alpha_sum, self._alpha_count)


# --------------------------------------------------------------------------- activations


class MassiveActivation(TypedDict):
    """Result of ``massive_activation``; batch, position and channel locate ``max_abs``."""

    max_abs: float
    median_abs: float
    ratio: float
    batch: int
    position: int
    channel: int


def _median(flat: Tensor) -> Tensor:
    """Median of a 1-D tensor; the mean of the two middle values when the count is even."""
    n = flat.numel()
    upper = flat.kthvalue(n // 2 + 1).values
    if n % 2:
        return upper
    return (flat.kthvalue(n // 2).values + upper) / 2


def massive_activation(hidden: Tensor) -> MassiveActivation:
    """M-Act of one layer (Sun et al. 2024).

    hidden: (B, T, D) residual-stream output of the layer. Returns ``max_abs`` = max |h|,
    ``median_abs`` = median |h| over all B*T*D entries, ``ratio`` = max_abs / median_abs
    (inf when the median is 0), and the (batch, position, channel) of the max.
    """
    if hidden.dim() != 3 or hidden.numel() == 0:
        raise ValueError(f"hidden must be a non-empty (B, T, D) tensor; got {tuple(hidden.shape)}")
    abs_BTD = hidden.detach().abs().to(torch.promote_types(hidden.dtype, torch.float32))
    flat = abs_BTD.reshape(-1)
    flat_idx = int(flat.argmax())
    b, t, d = (int(i) for i in torch.unravel_index(torch.tensor(flat_idx), abs_BTD.shape))
    max_abs = float(flat[flat_idx])
    median_abs = float(_median(flat))
    ratio = max_abs / median_abs if median_abs > 0 else math.inf
    return MassiveActivation(
        max_abs=max_abs, median_abs=median_abs, ratio=ratio, batch=b, position=t, channel=d
    )


def _position_norms(x: Tensor) -> Tensor:
    """Check ``x`` is (B, G, T, D) and return the L2 norm of every position, (B, G, T) float64."""
    if x.dim() != 4 or x.shape[2] == 0 or x.shape[0] == 0:
        raise ValueError(f"states must be a non-empty (B, G, T, D) tensor; got shape {tuple(x.shape)}")
    return x.detach().to(torch.float64).norm(dim=-1)


def first_position_norm_ratio(x: Tensor) -> Tensor:
    """How the first position's state compares in size with the others, per group.

    x: (B, G, T, D) states, G groups (attention heads of the value states; 1 for the
    residual stream). Returns (G,) float64: ``mean_b ||x[b, g, 0]|| / mean_{b, i >= 1}
    ||x[b, g, i]||`` (L2 norms over D). Below 1 the first position's value is drained
    (Guo et al. 2024: a sink's value shrinks); above 1 its state peaks. NaN when T == 1.
    """
    norms_BGT = _position_norms(x)
    if norms_BGT.shape[-1] < 2:
        return torch.full((norms_BGT.shape[1],), math.nan, dtype=torch.float64)
    return (norms_BGT[..., 0].mean(dim=0) / norms_BGT[..., 1:].mean(dim=(0, 2))).cpu()


class FirstPositionNorms:
    """Streaming :func:`first_position_norm_ratio` over many batches.

    Keeps per-group float64 sums of ``||x_0||`` and of ``||x_i||`` (i >= 1) with their
    counts, so the result equals the one-shot function on the batches concatenated along
    B (batches may differ in T; each position then counts once).
    """

    def __init__(self) -> None:
        self._first_sum: Tensor | None = None  # (G,) sum over sequences of ||x_0||
        self._rest_sum: Tensor | None = None  # (G,) sum over sequences and i >= 1 of ||x_i||
        self._first_count = 0  # sequences seen per group
        self._rest_count = 0  # positions i >= 1 seen per group

    def update(self, x: Tensor) -> None:
        """Add one batch of states, (B, G, T, D)."""
        norms_BGT = _position_norms(x)
        B, G, T = norms_BGT.shape
        if self._first_sum is not None and self._first_sum.shape[0] != G:
            raise ValueError(f"FirstPositionNorms saw {self._first_sum.shape[0]} groups before, now {G}")
        first = norms_BGT[..., 0].sum(dim=0).cpu()
        rest = norms_BGT[..., 1:].sum(dim=(0, 2)).cpu()
        self._first_sum = first if self._first_sum is None else self._first_sum + first
        self._rest_sum = rest if self._rest_sum is None else self._rest_sum + rest
        self._first_count += B
        self._rest_count += B * (T - 1)

    def _sums(self) -> tuple[Tensor, Tensor]:
        if self._first_sum is None or self._rest_sum is None:
            raise ValueError("FirstPositionNorms has no data; call update() first")
        return self._first_sum, self._rest_sum

    def per_group(self) -> Tensor:
        """(G,) ratio per group over everything seen (NaN when no position i >= 1 was seen)."""
        first, rest = self._sums()
        if self._rest_count == 0:
            return torch.full_like(first, math.nan)
        return (first / self._first_count) / (rest / self._rest_count)

    def overall(self) -> float:
        """The ratio with all groups pooled: mean over (sequence, group) of ``||x_0||`` over
        the mean over (sequence, group, i >= 1) of ``||x_i||``."""
        first, rest = self._sums()
        if self._rest_count == 0:
            return math.nan
        return float((first.sum() / self._first_count) / (rest.sum() / self._rest_count))


class TopActivations:
    """Streaming model-wide top ``k`` of |h| over (layer, position, channel).

    For every (layer, position, channel) the largest |h| over all sequences counts (with
    the sequence it sits in and its signed value); the ``k`` largest of those are kept.
    Exact up to ties: a batch passes on its own top ``k`` per layer, and an entry outside
    a batch's top ``k`` is beaten by ``k`` entries that are at least as large.
    """

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1; got {k}")
        self.k = k
        self._best: dict[tuple[int, int, int], tuple[float, float, int]] = {}  # key -> (|h|, h, sequence)
        self._sequences: dict[int, int] = {}  # layer -> sequences seen

    def update(self, layer: int, hidden: Tensor) -> None:
        """Add one batch of the residual stream of ``layer``, (B, T, C)."""
        if hidden.dim() != 3 or hidden.numel() == 0:
            raise ValueError(f"hidden must be a non-empty (B, T, D) tensor; got {tuple(hidden.shape)}")
        h = hidden.detach()
        abs_BTC = h.abs().to(torch.promote_types(h.dtype, torch.float32))
        top_TC, seq_TC = abs_BTC.max(dim=0)
        C = top_TC.shape[1]
        values, flat = top_TC.reshape(-1).topk(min(self.k, top_TC.numel()))
        offset = self._sequences.get(layer, 0)
        for a, i in zip(values.tolist(), flat.tolist(), strict=True):
            t, c = divmod(i, C)
            b = int(seq_TC[t, c])
            key = (layer, t, c)
            if key not in self._best or a > self._best[key][0]:
                self._best[key] = (a, float(h[b, t, c]), offset + b)
        self._sequences[layer] = offset + h.shape[0]
        self._best = dict(self._ranked()[: self.k])

    def _ranked(self) -> list[tuple[tuple[int, int, int], tuple[float, float, int]]]:
        return sorted(self._best.items(), key=lambda kv: (-kv[1][0], kv[0]))

    def top(self) -> list[dict[str, float | int]]:
        """The entries, largest |h| first: ``layer``, ``channel``, ``position``, ``sequence``,
        ``value`` (signed h)."""
        return [{"layer": layer, "channel": c, "position": t, "sequence": seq, "value": value}
                for (layer, t, c), (_, value, seq) in self._ranked()]


# --------------------------------------------------------------------------- gates

GateSummary = TypedDict(
    "GateSummary",
    {"mean": float, "frac_below_0.01": float, "frac_below_0.001": float, "count": int},
)


def _summary(total: float, below: Sequence[int], count: int) -> GateSummary:
    def frac(k: int) -> float:
        return below[k] / count if count else math.nan

    return {
        "mean": total / count if count else math.nan,
        "frac_below_0.01": frac(0),
        "frac_below_0.001": frac(1),
        "count": count,
    }


def _flat64(scores: Tensor) -> Tensor:
    return scores.detach().reshape(-1).to(torch.float64)


def _gate_sums(flat: Tensor) -> tuple[float, list[int], int]:
    """(sum, counts below each of GATE_THRESHOLDS, count) of a 1-D float64 tensor."""
    below = [int((flat < t).sum()) for t in GATE_THRESHOLDS]
    return float(flat.sum()), below, flat.numel()


def gate_statistics(scores: Tensor) -> GateSummary:
    """Gate score summary of any-shaped tensor of gate activations.

    Returns ``mean`` (over every element), ``frac_below_0.01`` and ``frac_below_0.001``
    (fraction of elements strictly below the threshold) and ``count`` (number of elements).
    Means and fractions are NaN for an empty tensor.
    """
    return _summary(*_gate_sums(_flat64(scores)))


class GateStats:
    """Streaming gate statistics over many batches and layers, exact up to float64 rounding.

    Keeps the sum, the element count, counts below 0.01 and 0.001, and a histogram of
    ``n_bins`` equal bins over [0, 1] (bin k covers [k/n, (k+1)/n), the last bin includes 1).
    Scores outside [0, 1] (SiLU or identity gates) go to ``underflow`` (< 0) or ``overflow``
    (> 1); NaN scores go to ``nan_count`` only (they still make the mean NaN), so
    ``counts.sum() + underflow + overflow + nan_count == count``.
    """

    def __init__(self, n_bins: int = 100) -> None:
        if n_bins < 1:
            raise ValueError(f"n_bins must be >= 1; got {n_bins}")
        self.n_bins = n_bins
        self.total = 0.0
        self.count = 0
        self.below = [0 for _ in GATE_THRESHOLDS]
        self.counts = np.zeros(n_bins, dtype=np.int64)
        self.underflow = 0
        self.overflow = 0
        self.nan_count = 0

    def update(self, scores: Tensor) -> None:
        """Add a tensor of gate scores of any shape."""
        flat = _flat64(scores)
        total, below, count = _gate_sums(flat)
        self.total += total
        self.count += count
        self.below = [a + b for a, b in zip(self.below, below, strict=True)]
        self.underflow += int((flat < 0).sum())
        self.overflow += int((flat > 1).sum())
        self.nan_count += int(flat.isnan().sum())
        inside = flat[(flat >= 0) & (flat <= 1)]
        bins = (inside * self.n_bins).floor().long().clamp(max=self.n_bins - 1)
        self.counts += torch.bincount(bins, minlength=self.n_bins).cpu().numpy()

    def merge(self, other: GateStats) -> None:
        """Add another accumulator's data (e.g. combine per-layer stats into a model total)."""
        if other.n_bins != self.n_bins:
            raise ValueError(f"cannot merge GateStats with {other.n_bins} and {self.n_bins} bins")
        self.total += other.total
        self.count += other.count
        self.below = [a + b for a, b in zip(self.below, other.below, strict=True)]
        self.counts += other.counts
        self.underflow += other.underflow
        self.overflow += other.overflow
        self.nan_count += other.nan_count

    def summary(self) -> GateSummary:
        """Same keys as ``gate_statistics``, over everything seen."""
        return _summary(self.total, self.below, self.count)

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(bin_edges (n_bins + 1,), counts (n_bins,)) over [0, 1]; see the class docstring."""
        return np.linspace(0.0, 1.0, self.n_bins + 1), self.counts.copy()


# --------------------------------------------------------------------------- training runs


def _as_float_array(losses: Sequence[float]) -> np.ndarray:
    return np.asarray(list(losses), dtype=np.float64).reshape(-1)


def _running_median(x: np.ndarray, window: int) -> np.ndarray:
    """out[i] = median of the finite values among x[i-window:i]; NaN where there are none."""
    padded = np.concatenate([np.full(window, np.nan), np.where(np.isfinite(x), x, np.nan)])
    windows = sliding_window_view(padded, window)[: len(x)]  # row i holds x[i-window:i]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows (no history yet)
        return np.nanmedian(windows, axis=1)


def _threshold(reference: np.ndarray | float, margin: float, relative: bool):
    return reference + margin * np.abs(reference) if relative else reference + margin


def loss_spikes(
    losses: Sequence[float],
    window: int = 50,
    margin: float = 0.2,
    relative: bool = True,
    steps: Sequence[int] | None = None,
) -> list[int]:
    """Steps where the training loss spikes.

    Step i is a spike when its loss is non-finite, or when it exceeds the median of the finite
    losses at the previous ``window`` steps (fewer at the start; step 0 has no history) by the
    margin: ``loss > median * (1 + margin)`` when ``relative`` (default: 20 % above), else
    ``loss > median + margin``. Returns indices into ``losses``, or ``steps[i]`` when given.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1; got {window}")
    x = _as_float_array(losses)
    if steps is not None and len(steps) != len(x):
        raise ValueError(f"steps has {len(steps)} entries but losses has {len(x)}")
    median = _running_median(x, window)
    with np.errstate(invalid="ignore"):
        spike = ~np.isfinite(x) | (np.isfinite(median) & (x > _threshold(median, margin, relative)))
    idx = np.flatnonzero(spike).tolist()
    return [int(steps[i]) for i in idx] if steps is not None else idx


def diverged(losses: Sequence[float], diverge_factor: float = DIVERGE_FACTOR) -> bool:
    """Whether a recorded loss curve diverged, by the trainer's rule
    (:mod:`gatedattn.train.divergence`): a non-finite loss, or a loss above
    ``diverge_factor`` times the first finite loss."""
    if len(losses) == 0:
        raise ValueError("diverged needs at least one loss value")
    return first_divergence(losses, diverge_factor) is not None


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std with ddof=1) over seeds; std is NaN for a single value (unknown)."""
    vals = np.asarray([float(v) for v in values], dtype=np.float64)
    if vals.size == 0:
        raise ValueError("mean_std needs at least one value")
    with np.errstate(invalid="ignore"):  # inf - inf in the std of a diverged seed -> NaN
        std = float(vals.std(ddof=1)) if vals.size > 1 else math.nan
    return float(vals.mean()), std


class Stat(TypedDict):
    """One metric over seeds: ``mean``, sample ``std`` (None for one seed), per-seed ``values``."""

    mean: float
    std: float | None
    values: list[float]


def seed_stat(values: Sequence[float | None]) -> Stat | None:
    """The :class:`Stat` of per-seed values; None when there are none or any is missing
    (a metric not measured in every seed has no comparable mean). The one rule of every
    study's summaries."""
    if not values or any(v is None for v in values):
        return None
    mean, std = mean_std(values)
    return {"mean": mean, "std": None if math.isnan(std) else std, "values": [float(v) for v in values]}


def differs_beyond_noise(a: Sequence[float], b: Sequence[float], k: float = 2.0) -> bool | None:
    """Whether two variants differ by more than seed noise.

    a, b: one metric value per seed. Rule: |mean_a - mean_b| > k * sqrt(std_a^2 + std_b^2)
    with sample stds (k = 2 by default). Returns None when it cannot be judged: fewer than two
    seeds on either side, or a non-finite mean or std (e.g. a diverged seed).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
    if not all(math.isfinite(v) for v in (mean_a, std_a, mean_b, std_b)):
        return None
    return abs(mean_a - mean_b) > k * math.hypot(std_a, std_b)
