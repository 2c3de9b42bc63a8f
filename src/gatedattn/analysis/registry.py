"""Every metric the studies summarise, declared once: its key, its label and digits in
tables, which way is better, and what produces it.

``source`` names the producer: ``analysis`` (:func:`gatedattn.analysis.analyze`, natural
text), ``run`` (the trainer's record of a run), ``mechanism``
(:func:`gatedattn.reproduce.mechanism.probe.measure`, Bigram-Backcopy by query class).
The main job's summaries and results table, the mechanism study's summaries and table
read these lists; a new metric is one line here plus the code that computes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    digits: int
    lower_is_better: bool | None  # None: a description, not a score
    source: str
    table: bool = True  # a column of the study's results table


TEXT_METRICS: tuple[Metric, ...] = (
    Metric("val_loss", "val loss", 4, True, "analysis"),
    Metric("val_ppl", "val PPL", 2, True, "analysis"),
    Metric("f_attn", "F-Attn", 4, True, "analysis"),
    Metric("sink_eps", "Sink^ε", 3, True, "analysis"),
    Metric("m_act", "M-Act", 1, True, "analysis"),
    Metric("m_act_ratio", "M-Act / median", 0, True, "analysis"),
    Metric("gate_mean", "gate mean", 3, True, "analysis"),
    Metric("gate_frac_below_0.01", "gate < 0.01", 3, False, "analysis"),
    Metric("gate_frac_below_0.001", "gate < 0.001", 3, False, "analysis", table=False),
    Metric("sink_mass", "learnable-sink mass", 3, None, "analysis", table=False),
    Metric("tokens_per_s", "train tokens/s", 0, False, "run"),
    Metric("final_train_loss", "final train loss", 4, True, "run", table=False),
)

MECHANISM_METRICS: tuple[Metric, ...] = (
    Metric("bos_attn_ordinary", "BOS attn, ordinary", 3, True, "mechanism"),
    Metric("bos_attn_trigger", "BOS attn, trigger", 3, True, "mechanism"),
    Metric("prev_attn_trigger", "prev-token attn, trigger", 3, False, "mechanism"),
    Metric("sink_mass_ordinary", "learnable sink, ordinary", 3, None, "mechanism"),
    Metric("sink_mass_trigger", "learnable sink, trigger", 3, None, "mechanism", table=False),
    Metric("sink_logit", "sink logit", 2, None, "mechanism", table=False),
    Metric("f_attn", "F-Attn", 3, True, "mechanism"),
    Metric("sink_eps", "Sink^ε", 2, True, "mechanism"),
    Metric("value_norm_bos", "‖v‖ BOS", 2, None, "mechanism"),
    Metric("value_norm_other", "‖v‖ other", 2, None, "mechanism"),
    Metric("resid_norm_bos", "‖h‖ BOS", 1, None, "mechanism"),
    Metric("resid_norm_other", "‖h‖ other", 1, None, "mechanism"),
    Metric("m_act", "M-Act", 1, True, "mechanism", table=False),
    Metric("m_act_ratio", "M-Act / median", 1, True, "mechanism"),
    Metric("gate_trigger", "gate, trigger", 3, None, "mechanism"),
    Metric("gate_ordinary", "gate, ordinary", 3, True, "mechanism"),
    Metric("loss_copy", "loss, copy", 3, True, "mechanism"),
    Metric("loss_bigram", "loss, bigram", 3, True, "mechanism"),
    Metric("bigram_floor", "bigram floor", 3, None, "mechanism", table=False),
    Metric("uniform_bos_attn_ordinary", "uniform BOS attn, ordinary", 3, None, "mechanism", table=False),
)


def keys(metrics: tuple[Metric, ...], source: str | None = None) -> tuple[str, ...]:
    """The keys of ``metrics`` (of one ``source`` when given)."""
    return tuple(m.key for m in metrics if source is None or m.source == source)


def columns(metrics: tuple[Metric, ...]) -> list[tuple[str, str, int]]:
    """(key, label, digits) of the metrics that are table columns, in order."""
    return [(m.key, m.label, m.digits) for m in metrics if m.table]
