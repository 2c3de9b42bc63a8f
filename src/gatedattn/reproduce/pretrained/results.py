"""The real-model study's results (``PretrainedResults``): what ``results.json`` holds
under ``pretrained``, the study alone as in the main job. Each field is one key, in the
order the study writes them (keyword-only, so that a key it writes last may follow
optional ones); an :func:`optional` one is written only where that stage ran. Nested values stay JSON-like, as the claims and the report read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gatedattn.reproduce.part_results import PartResults, optional


@dataclass(frozen=True, kw_only=True)
class PretrainedResults(PartResults):
    """The frozen model's sink, the first token as a no-op, the arms that take its job,
    streaming and continued pretraining, and the claims judged from them."""

    PART: ClassVar[str] = "pretrained"

    config: dict[str, Any]  # the study's PretrainedConfig.to_dict() (kept_tol added where old arms were credited)
    model: dict[str, Any]  # the model: path, name, layers (and full_layers before a cut), sizes, first_token
    text: str  # the bundled corpus the windows come from, with its sources' versions
    sink: dict[str, Any]  # the sink as it is: F-Attn, Sink^eps, drain, peak and M-Act, per layer and head
    noop: list[dict[str, Any]]  # the no-op curve: per window W (0: full attention), the losses kept and dropped
    window: int | None  # the arms' window W (None: no window's gap was clear, so no arm trained)
    window_why: str  # why that window (or why none)
    noop_plain: list[dict[str, Any]] | None = optional()  # with no special first token (a model that has one)
    start_layer: int | None = optional()  # the first layer the arms train (where F-Attn exceeds sink_layers_eps)
    first_logits: list[Any] | None = optional()  # each head's mean score on the first position (the sink's start)
    untouched: dict[str, Any] | None = optional()  # the untouched model at W: its losses and per-head figures
    arms: dict[str, Any] | None = optional()  # per arm: what it is, its parameters, every run and its recovery
    arm_precision: dict[str, Any] | None = optional()  # the arms' steps' dtype and why, and the looks' dtype
    streaming: dict[str, Any] | None = optional()  # per-position loss over one long text, per mode and arm
    continued: dict[str, Any] | None = optional()  # continued pretraining, as it is and gated (continued_steps > 0)
    stage_seconds: dict[str, float]  # each stage's seconds, as measured when it ran (reused ones: then)
    minutes: float  # the model's load and every stage, summed
    claims: list[dict[str, Any]] | None = optional()  # one row per claim, judged (left out until judged)
