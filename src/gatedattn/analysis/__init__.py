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
from gatedattn.analysis.analyze import (  # noqa: E402  (after the metrics it uses)
    analyze,
    extrapolate,
    extrapolation_curves,
    format_analysis,
    format_extrapolation,
    load_any,
)
from gatedattn.analysis.probe import Probe, hooked  # noqa: E402

__all__ = [
    "Probe",
    "analyze",
    "extrapolate",
    "extrapolation_curves",
    "format_analysis",
    "format_extrapolation",
    "hooked",
    "load_any",
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
