"""``gatedattn reproduce --study lr``: training stability over a ladder of learning rates.

Every variant of ``LrConfig.variants`` (baseline and gated by default) trains once at each
learning rate of ``lrs``, all for the same steps on the same batches; the table records
each run's final loss, loss spikes and divergence, and the smallest learning rate at
which each variant first spiked and first diverged. The claim it settles is the paper's
"gating keeps training stable at a high learning rate" (``ga-stability`` in
:mod:`gatedattn.reproduce.claims`). Its results fold into the main job's report with
``gatedattn reproduce --fold DIR``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gatedattn import paper as P
from gatedattn.data import TokenData
from gatedattn.reproduce.batch import run_batch
from gatedattn.reproduce.study_report import write_study_report
from gatedattn.reproduce.verdicts import HELD, NOT_HELD, NOT_MEASURABLE, Claim, Verdict
from gatedattn.reproduce.registry import Flag, list_of
from gatedattn.reproduce.text.config import RUN_APART_FLAGS, TextConfig
from gatedattn.reproduce.text.plan import plan_steps
from gatedattn.reproduce.text.run import describe_recipe, run_apart, text_run
from gatedattn.infra.settings import option

NAME = "lr"  # the study's name in the registry
KEY = "lr_study"  # where the study's results sit in results.json


@dataclass(frozen=True)
class LrConfig(TextConfig):
    """The learning-rate study: the natural-text recipe of :class:`TextConfig` at each
    learning rate of ``lrs`` (one seed; no analysis beyond the losses)."""

    STUDY: ClassVar[str] = NAME

    out_dir: str = option("runs/reproduce-lr", help="output directory")
    lrs: tuple[float, ...] = option((1e-3, 3e-3, 1e-2, 3e-2), gt=0, help="learning-rate ladder")

    @classmethod
    def _quick_fields(cls) -> dict[str, Any]:
        return {"lrs": (3e-3, 3e-2)}


def train_ladder(cfg: LrConfig, data_dir: Path, data: TokenData, out: Path) -> dict[str, Any]:
    """Every variant at every learning rate: which diverged, how many spikes."""
    steps, _ = plan_steps(cfg, data, len(cfg.lrs))
    ladder = run_batch([text_run(cfg, data_dir, data, variant, 0, steps, out, lr=lr, analyse=False)
                        for lr in cfg.lrs for variant in cfg.variants])
    runs = [{k: r[k] for k in ("variant", "lr", "diverged", "diverged_reason", "spikes", "final_loss", "steps")}
            for r in ladder]
    return {"steps": steps, "runs": runs, "recipe": describe_recipe(cfg.train_config("baseline", 0, steps=steps),
                                                                   data.vocab_size)}


def lr_section(results: dict[str, Any], out: Path) -> list[str]:
    """The study's tables (nothing where ``results`` holds no learning-rate study)."""
    study = results.get(KEY)
    if not study:
        return []
    lines = ["## Learning-rate study", ""]
    if study.get("recipe"):
        lines += [f"Recipe: {study['recipe']}.", ""]
    lines += ["| variant | LR | final loss | loss spikes | diverged |", "|---|---:|---:|---:|---|"]
    lines += [_run_row(r) for r in sorted(study["runs"], key=lambda r: (r["lr"], r["variant"]))]
    lines += ["", "| variant | first loss spike at LR | first divergence at LR |", "|---|---:|---:|"]
    for v in dict.fromkeys(r["variant"] for r in study["runs"]):
        first = {k: "none" if lr is None else lr for k, lr in first_unstable_lr(study["runs"], v).items()}
        lines.append(f"| `{v}` | {first['spike']} | {first['diverged']} |")
    return lines + [""]


def _run_row(r: dict[str, Any]) -> str:
    loss = r.get("final_loss")
    loss_s = f"{loss:.3f}" if loss is not None and math.isfinite(loss) else str(loss)
    return f"| `{r['variant']}` | {r['lr']:g} | {loss_s} | {r.get('spikes', 0)} | {'yes' if r.get('diverged') else 'no'} |"


def write_lr_report(results: dict[str, Any], out: Path) -> Path:
    return write_study_report(results, out, title="learning-rate study", key=KEY, section=lr_section, claims=(STABILITY,))


def run_lr(cfg: LrConfig, command: str | None = None) -> Path:
    """Train the ladder; write results.json and report.md; returns the report's path."""
    return run_apart(cfg, command, KEY, train_ladder, write_lr_report)


__all__ = ["LrConfig", "lr_section", "run_lr", "train_ladder", "write_lr_report"]

def _lr_study_outcome(rows: list[dict]) -> tuple[list[float], list[float], dict[str, int]]:
    """Learning rates at which baseline and gated diverged, and their loss spikes in all."""
    def diverged_at(variant: str) -> list[float]:
        return sorted({r["lr"] for r in rows if r["variant"] == variant and r.get("diverged")})

    spikes = {v: sum(r.get("spikes", 0) for r in rows if r["variant"] == v) for v in ("baseline", "gated")}
    return diverged_at("baseline"), diverged_at("gated"), spikes


def first_unstable_lr(rows: list[dict], variant: str) -> dict[str, float | None]:
    """The smallest learning rate at which ``variant`` had a loss spike, and at which it
    diverged (None: never on this ladder)."""
    mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["lr"])
    spike = next((r["lr"] for r in mine if r.get("spikes", 0) > 0 or r.get("diverged")), None)
    diverged = next((r["lr"] for r in mine if r.get("diverged")), None)
    return {"spike": spike, "diverged": diverged}


def _lr_text(lr: float | None) -> str:
    return "none" if lr is None else f"{lr:g}"


def _stability(results: dict) -> Verdict:
    study = results.get(KEY)
    if not study:
        return Verdict(NOT_MEASURABLE, "the learning-rate study was not run (`gatedattn reproduce --study lr`)")
    rows = study.get("runs", [])
    base_div, gated_div, spikes = _lr_study_outcome(rows)
    first = {v: first_unstable_lr(rows, v) for v in ("baseline", "gated")}
    top = max((r["lr"] for r in rows), default=None)
    text = ("first loss spike at LR " + " vs ".join(f"{_lr_text(first[v]['spike'])} ({v})" for v in first)
            + "; first divergence at LR " + " vs ".join(f"{_lr_text(first[v]['diverged'])} ({v})" for v in first)
            + f"; loss spikes {spikes['baseline']} vs {spikes['gated']} over LRs up to {_lr_text(top)}")
    if base_div and (not gated_div or min(gated_div) > min(base_div)):
        return Verdict(HELD, text)
    if gated_div and (not base_div or min(gated_div) < min(base_div)):
        return Verdict(NOT_HELD, text)
    if _clearly_fewer(spikes["gated"], spikes["baseline"]):
        return Verdict(HELD, text + "; no divergence, clearly fewer spikes with the gate")
    if _clearly_fewer(spikes["baseline"], spikes["gated"]):
        return Verdict(NOT_HELD, text + "; no divergence, clearly more spikes with the gate")
    return Verdict(NOT_MEASURABLE, text + "; neither diverged differently at these learning rates, and the spike "
                                          f"counts differ by less than {SPIKE_FACTOR:g}x (or fewer than "
                                          f"{MIN_SPIKES} spikes)")


SPIKE_FACTOR = 2.0  # without divergence, spike counts decide only when one is at most half the other


MIN_SPIKES = 3  # ... and the larger count is at least this (one or two spikes are batch noise)


def _clearly_fewer(few: int, many: int) -> bool:
    return many >= MIN_SPIKES and few * SPIKE_FACTOR <= many


STABILITY = Claim("ga-stability", "Gated Attention", "Gating keeps training stable at a high learning rate",
                  f"baseline diverges at LR {P.UNSTABLE_LR:.0e}, gated trains".replace("e-0", "e-"), _stability)
CLAIMS = (STABILITY.key,)  # the claims its results settle

FLAGS: dict[str, Flag] = {**RUN_APART_FLAGS,
                          "--lrs": Flag("lrs", "learning-rate ladder (default "
                                        f"{','.join(f'{x:g}' for x in LrConfig.__dataclass_fields__['lrs'].default)})",
                                        type=list_of(float, "--lrs"))}
