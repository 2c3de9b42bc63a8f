"""The natural-text study's results (``TextResults``): the keys its part writes at the top
level of ``results.json`` (where every natural-text report reads them), beside the job's
own keys (``study``, ``config``, ``meta``, ``folded``), the other parts' keys and the keys
of studies folded in. Each field is one key, in the order the part writes them; nested
values stay JSON-like, as the claims and the report read them.

Sharing the top level, the part's keys are picked out of a whole results dict
(:meth:`TextResults.from_results`) and written back into one in place
(:meth:`TextResults.merge_into`): a key already there keeps its position, so a
``results.json`` reads back and writes again with its key order unchanged whatever keys
sit between the part's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, MutableMapping

from gatedattn.reproduce.part_results import PartResults, optional
from gatedattn.reproduce.text.config import NAME


@dataclass(frozen=True, kw_only=True)
class TextResults(PartResults):
    """Every variant's runs and their summaries over seeds, the gate's cost, the training
    step timed per variant, and the claims judged from them (with the folded studies').

    ``variants[variant]["runs"]`` holds one record per seed (its curves, losses, analysis
    and extrapolation); ``summary[variant]`` each headline metric's mean, std and per-seed
    values. Keys results written before they were recorded lack (``text_minutes``,
    ``step_mfu``) are :func:`optional`, as is a key written only where it has a value."""

    PART: ClassVar[str] = NAME

    variants: dict[str, Any]  # per variant: {"runs": one record per seed}
    summary: dict[str, Any]  # per variant: each headline metric's mean, std and per-seed values
    text_minutes: float | None = optional()  # the variants' training and analysis, wall time
    strongest_layer: int | None = optional()  # where the baseline's sink is strongest (no baseline runs: left out)
    gate_cost: dict[str, Any]  # per variant: an attention layer's parameters and FLOPs, total and of the gate
    step_time_samples: dict[str, list[float]]  # per variant: seconds a training step took, one per interleaved round
    step_time: dict[str, float]  # per variant: the median of its samples
    step_mfu: dict[str, Any] | None = optional()  # per variant: model FLOP/s and MFU of that step
    claims: list[dict[str, Any]] | None = optional()  # one row per claim, judged (left out until judged)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The top-level keys the part writes, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_results(cls, results: Mapping[str, Any]) -> "TextResults":
        """The part's keys picked out of a whole ``results.json`` (the job's own keys, the
        other parts' and the folded studies' left where they are), read by
        :meth:`from_dict` (a ConfigError naming a key it always writes that is missing,
        or a value of the wrong kind)."""
        return cls.from_dict({k: results[k] for k in cls.keys() if k in results})

    def merge_into(self, results: MutableMapping[str, Any]) -> None:
        """Write the part's keys into ``results`` at its top level: a key already there
        takes its new value where it stands, a new one is added at the end (in declared
        order), and an :func:`optional` key without a value is taken out."""
        written = self.to_dict()
        for key in self.keys():
            if key in written:
                results[key] = written[key]
            else:
                results.pop(key, None)
