"""What :func:`gatedattn.analysis.analyze` returns: ``AnalysisResult``, a JSON-serialisable
dict whose keys are documented here, where they are declared.

L is the number of layers, H of query heads, Hkv of key/value heads; per-layer lists are
in layer order. A figure that is not finite is None. Some keys hold a dot
(``gate_frac_below_0.01``), so the types use the call form of ``TypedDict``; the dicts
stay plain dicts, in this key order, so ``gatedattn analyze --json`` writes them as before.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class FirstTokenRecord(TypedDict):
    """The first position of every window: ``mode`` as given (``bos``, ``none``, ``id``,
    ...) or ``unspecified``; ``id`` the token there (None: none, or the windows differ)."""

    mode: str
    id: int | None


class ChannelPeak(TypedDict):
    """Where one largest |h| of the residual stream sits, and its signed value."""

    layer: int
    channel: int
    position: int
    sequence: int
    value: float | None


class ChannelPeaks(TypedDict):
    per_layer: list[ChannelPeak]  # each layer's largest |h|
    top: list[ChannelPeak]  # the model's n_top_channels largest |h| over (layer, position, channel), largest first


GateRecord = TypedDict("GateRecord", {
    "mean": float | None,  # the mean gate score
    "frac_below_0.01": float | None,  # the share of scores below 0.01 (a closed gate)
    "frac_below_0.001": float | None,
    "count": int,  # scores counted
})


class GateHistogram(TypedDict):
    edges: list[float]  # bin edges over [0, 1]
    counts: list[int]
    underflow: int  # scores below 0, above 1, and NaN
    overflow: int
    nan: int


AnalysisResult = TypedDict("AnalysisResult", {
    # the run
    "variant": str,  # the model's attention preset (its class name where it has none)
    "n_layers": int,
    "n_heads": int,
    "seq_len": int | None,  # T, the inputs' length (None where the batches differ)
    "n_sequences": int,
    "n_tokens": int,  # predicted tokens
    "val_loss": float | None,  # mean next-token cross-entropy (nats)
    "val_ppl": float | None,  # exp(val_loss); inf where it overflows
    "first_token": FirstTokenRecord,
    "windows": dict[str, Any],  # count (n_sequences) and length (seq_len); the command adds where they came from
    # attention on the first position
    "f_attn": float | None,  # F-Attn: the mean over layers of f_attn_per_layer
    "f_attn_per_layer": list[float | None],
    "f_attn_per_head": list[list[float | None]],  # L x H: per head, the mean attention on position 0 over queries 1..T-1
    "eps": float,  # the Sink^eps threshold
    "sink_eps": float | None,  # Sink^eps: the share of (layer, head) pairs whose sink_alpha exceeds eps
    "sink_eps_per_layer": list[float | None],
    "sink_alpha": list[list[float | None]],  # L x H: each head's mean attention on position 0
    "sink_mass": float | None,  # the mean probability on a learnable sink (None without one; F-Attn counts key 0 only)
    "sink_mass_per_layer": list[float | None] | None,
    # massive activations: the residual stream after each block
    "m_act": float | None,  # M-Act: the largest |h| of any layer
    "m_act_layer": int,  # the layer of m_act
    "m_act_per_layer": list[float | None],
    "m_act_ratio": float | None,  # max |h| / median |h| at m_act_layer (so it describes m_act itself)
    "m_act_ratio_max": float | None,  # the largest ratio of any layer
    "m_act_ratio_per_layer": list[float | None],
    "m_act_median_per_layer": list[float | None],  # the median of per-batch medians of |h|
    "m_act_location_per_layer": list[list[int] | None],  # [sequence, position, channel] of each layer's max
    # the first position's value and residual states
    "value_drain_per_layer": list[float | None],  # mean ||v_0|| / mean over i >= 1 of ||v_i||, the heads pooled
    "value_drain_per_head": list[list[float | None]],  # L x Hkv; the value states attention mixes (after a g2 gate)
    "residual_peak_per_layer": list[float | None],  # ||h_0|| / mean over i >= 1 of ||h_i||, norms over channels
    "m_act_channels": ChannelPeaks,
    # gates: every one None for a model without a gate
    "gate_mean": float | None,
    "gate_frac_below_0.01": float | None,
    "gate_frac_below_0.001": float | None,
    "gate_count": int | None,
    "gate_per_layer": list[GateRecord | None] | None,
    "gate_mean_per_layer": list[float | None] | None,
    # per score name: score (the X or fused X+H score), h_score (H under multiplicative fusion), c.score (HyGA's C)
    "gate_per_score": dict[str, GateRecord | None] | None,
    "gate_histogram": GateHistogram | None,
    # the head-averaged attention map of each layer asked for (first sequence, first map_size queries and keys)
    "attention_maps": dict[str, list[list[float]]],
    # added by ``gatedattn analyze``, not by analyze()
    "model": NotRequired[str],
    "data": NotRequired[str | None],
    "plots": NotRequired[list[str]],
})
