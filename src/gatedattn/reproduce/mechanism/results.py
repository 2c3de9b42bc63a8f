"""The mechanism study's results (``MechanismResults``): what its ``results.json`` holds
alone, and what the main job's holds under ``mechanism``. Each field is one key, in the
order the study writes them; the depth blocks stay JSON-like dicts (their keys below)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gatedattn.reproduce.mechanism.config import NAME
from gatedattn.reproduce.part_results import PartResults, optional


@dataclass(frozen=True, kw_only=True)
class MechanismResults(PartResults):
    """The summaries per depth and variant, their claims, and what the study ran.

    A depth block (``depths[str(depth)]``) holds ``summary`` (per variant, each metric's
    mean, std and per-seed values at the baseline's strongest layer), ``claims`` (one row
    per claim judged: key, claim, paper, verdict, measured), ``strongest_layer`` (that
    layer, None without baseline runs) and ``runs`` (per variant, each seed's curves and
    losses)."""

    PART: ClassVar[str] = NAME

    study: str  # "mechanism": the study that wrote them
    config: dict[str, Any]  # the study's MechanismConfig.to_dict()
    task: dict[str, Any]  # the generated task: description, chars, triggers, fingerprint, the uniform levels
    depths: dict[str, Any]  # depth (as a string) -> its block (see above)
    run_minutes: float  # the runs' wall time summed (finished runs reused: as they took when they ran)
    minutes: float | None = optional()  # as a part of the main job: the part's wall time
    meta: dict[str, Any] | None = optional()  # the study alone: its command, machine, software and date
