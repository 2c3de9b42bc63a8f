"""Analysis: metric functions (re-exported here), :func:`analyze`, analysis windows
(:mod:`~gatedattn.analysis.windows`: one document each, the chosen first token) and plots
(``gatedattn.analysis.plots``).

``plots`` is not imported here, so using the metrics does not import matplotlib.
"""

from gatedattn.analysis.metrics import (
    AttentionStats,
    FirstPositionNorms,
    GateStats,
    GateSummary,
    MassiveActivation,
    differs_beyond_noise,
    diverged,
    first_token_attention,
    first_token_attention_per_head,
    first_position_norm_ratio,
    gate_statistics,
    loss_spikes,
    massive_activation,
    mean_std,
    sink_fraction,
    sink_fraction_per_layer,
    sink_scores,
    TopActivations,
)
from gatedattn.analysis.windows import (
    FirstToken,
    document_windows,
    model_tokenizer,
    resolve_first_token,
    tokenizer_convention,
    stream_documents,
    text_documents,
    tokenize_documents,
    val_documents,
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
from gatedattn.analysis.result import AnalysisResult  # noqa: E402

__all__ = [
    "AnalysisResult",
    "FirstToken",
    "Probe",
    "analyze",
    "document_windows",
    "extrapolate",
    "extrapolation_curves",
    "format_analysis",
    "format_extrapolation",
    "hooked",
    "load_any",
    "model_tokenizer",
    "resolve_first_token",
    "tokenizer_convention",
    "stream_documents",
    "text_documents",
    "tokenize_documents",
    "val_documents",
    "AttentionStats",
    "FirstPositionNorms",
    "GateStats",
    "GateSummary",
    "MassiveActivation",
    "differs_beyond_noise",
    "diverged",
    "first_token_attention",
    "first_token_attention_per_head",
    "first_position_norm_ratio",
    "gate_statistics",
    "loss_spikes",
    "massive_activation",
    "mean_std",
    "sink_fraction",
    "sink_fraction_per_layer",
    "sink_scores",
    "TopActivations",
]
