"""The mechanism study's results from its runs' records: per depth, each variant's
figures (mean, std, per-seed values) at the baseline's strongest layer, and the claims."""

from __future__ import annotations

from typing import Any

from gatedattn.analysis.metrics import seed_stat
from gatedattn.analysis.registry import MECHANISM_METRICS, keys
from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.reproduce.mechanism.claims import judge_mechanism
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.verdicts import uniform_first_token_attention

SUMMARY_KEYS = keys(MECHANISM_METRICS)


RUN_FIELDS = ("seed", "curve", "final_loss", "wall_seconds", "train_seconds")


def depth_block(cfg: MechanismConfig, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One depth's runs: per variant the summary at the baseline's strongest layer, the
    claims, that layer, and each seed's curves."""
    by_variant: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        by_variant.setdefault(r["variant"], []).append(r)
    layer = strongest_layer(by_variant.get("baseline", []))
    summary = {v: {**summarize([at_layer(r["final"], layer) for r in runs]),
                   "final_train_loss": seed_stat([r["final_loss"] for r in runs])} for v, runs in by_variant.items()}
    view = {"summary": summary, "config": {"seq_len": cfg.seq_len}}
    return {"summary": summary, "claims": judge_mechanism(view), "strongest_layer": layer,
            "runs": {v: [{k: r[k] for k in RUN_FIELDS} for r in runs] for v, runs in by_variant.items()}}


def build_results(cfg: MechanismConfig, task: BigramBackcopy, records: list[dict[str, Any]]) -> MechanismResults:
    """Summaries per depth and variant (mean, std, per-seed values) and the claims."""
    n_after_bos = cfg.seq_len - 1
    depths = {str(depth): depth_block(cfg, [r for r in records if r["depth"] == depth]) for depth in cfg.depths}
    first = records[0]["final"] if records else {}
    return MechanismResults(
        study="mechanism",
        config=cfg.to_dict(),
        task={"description": task.describe(), "chars": list(task.chars),
              "triggers": [task.chars[t] for t in task.triggers], "fingerprint": task.fingerprint(),
              "trigger_fraction": first.get("trigger_fraction"),
              "uniform_f_attn": uniform_first_token_attention(n_after_bos),
              "uniform_bos_attn_ordinary": first.get("uniform_bos_attn_ordinary"),
              "uniform_bos_attn_trigger": first.get("uniform_bos_attn_trigger")},
        depths=depths,
        run_minutes=sum(r["wall_seconds"] for r in records) / 60,
    )


def strongest_layer(baseline_runs: list[dict[str, Any]]) -> int | None:
    """The layer where the baseline's BOS attention from ordinary positions is largest
    (seed mean), where the claims are judged: a sink in one layer is not averaged away by
    the others. None without baseline runs."""
    per_layer = [r["final"].get("bos_attn_ordinary_per_layer") for r in baseline_runs]
    per_layer = [p for p in per_layer if p]
    if not per_layer:
        return None
    means = [sum(v for v in col if v is not None) / len(col) for col in zip(*per_layer)]
    return max(range(len(means)), key=means.__getitem__)


def at_layer(final: dict[str, Any], layer: int | None) -> dict[str, Any]:
    """``final`` with every per-layer figure read at ``layer`` (as is when None)."""
    if layer is None:
        return final
    view = dict(final)
    for key, values in final.items():
        if key.endswith("_per_layer") and values and layer < len(values):
            view[key[: -len("_per_layer")]] = values[layer]
    return view


def summarize(finals: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: seed_stat([f.get(k) for f in finals]) for k in SUMMARY_KEYS}
