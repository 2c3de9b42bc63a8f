"""Analysis: metric functions (re-exported here) and plots (``gatedattn.analysis.plots``).

``plots`` is not imported here, so using the metrics does not import matplotlib.
"""

from gatedattn.analysis.metrics import (
    AttentionStats,
    GateStats,
    GateSummary,
    MassiveActivation,
    differs_beyond_noise,
    diverged,
    first_token_attention,
    first_token_attention_per_head,
    gate_statistics,
    loss_spikes,
    massive_activation,
    mean_std,
    sink_fraction,
    sink_fraction_per_layer,
    sink_scores,
)

__all__ = [
    "AttentionStats",
    "GateStats",
    "GateSummary",
    "MassiveActivation",
    "differs_beyond_noise",
    "diverged",
    "first_token_attention",
    "first_token_attention_per_head",
    "gate_statistics",
    "loss_spikes",
    "massive_activation",
    "mean_std",
    "sink_fraction",
    "sink_fraction_per_layer",
    "sink_scores",
]
