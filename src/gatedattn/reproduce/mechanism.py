"""``gatedattn reproduce --study mechanism``: the attention sink at toy scale.

Small models (one head, no q/k norm) are trained on the Bigram-Backcopy task
(:mod:`gatedattn.data.backcopy`), where ordinary positions have nothing useful to attend
to and trigger positions must copy the token before them. Every variant trains from the
same seeds on the same batches (the trainer's batches are a function of the seed and the
step). :mod:`gatedattn.reproduce.mechanism_probe` measures each model by query class
during and after training; the report judges four claims per depth.

Layout of ``out``::

    out/results.json, out/report.md, out/*.png
    out/data/                       the generated task (a prepared data directory)
    out/runs/<variant>-L<depth>-s<seed>/   each run (the trainer's files, mechanism.json)

A second call with the same ``out`` reuses finished runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gatedattn import __version__
from gatedattn.analysis.metrics import mean_std
from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.errors import ConfigError
from gatedattn.fmt import fmt_mean_std as _fmt
from gatedattn.io import atomic_write_json, json_safe, read_json_object
from gatedattn.reproduce.claims import (
    HELD, NOT_HELD, NOT_MEASURABLE, Verdict, compare, compare_metrics, sink_shown,
    uniform_first_token_attention,
)
from gatedattn.reproduce.mechanism_probe import measure

STUDY_VARIANTS = ("baseline", "gated", "gated-headwise", "sink", "hyga-lowrank")
GATED = ("gated", "gated-headwise", "hyga-lowrank")
ANALYSIS_SEED = 10_000  # analysis sequences are drawn apart from the training data
CURVE_KEYS = ("bos_attn_ordinary", "bos_attn_trigger", "prev_attn_trigger", "gate_ordinary", "gate_trigger",
              "sink_mass_ordinary", "loss_copy", "loss_bigram", "resid_norm_bos", "value_norm_bos", "value_norm_other")
SUMMARY_KEYS = ("bos_attn_ordinary", "bos_attn_trigger", "prev_attn_trigger", "sink_mass_ordinary",
                "sink_mass_trigger", "f_attn", "sink_eps", "value_norm_bos", "value_norm_other", "resid_norm_bos",
                "resid_norm_other", "m_act", "m_act_ratio", "gate_trigger", "gate_ordinary", "loss_copy",
                "loss_bigram", "bigram_floor", "uniform_bos_attn_ordinary")


@dataclass(frozen=True)
class MechanismConfig:
    """One mechanism study. Every variant in ``variants`` trains at ``depths[0]`` layers;
    the deeper ``depths`` train only the ``deep_variants``. ``seeds`` runs of each.

    The defaults come from measured curves on a 2-core CPU (docs/reproduction-mechanism):
    the baseline's BOS attention from ordinary positions stays near the uniform level for
    the first ~1,500 steps and then grows as the learning rate anneals, so the steps go to
    every 1-layer variant and to the baseline and gated at 3 layers, two runs at a time."""

    variants: tuple[str, ...] = STUDY_VARIANTS
    depths: tuple[int, ...] = (1, 3)
    deep_variants: tuple[str, ...] = ("baseline", "gated")
    seeds: int = 3
    steps: int = 3000
    seq_len: int = 64
    micro_batch: int = 16
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    n_chars: int = 24
    n_triggers: int = 3
    evals: int = 10
    analysis_sequences: int = 256
    workers: int = 2
    out_dir: str = "runs/reproduce-mechanism"
    progress: bool = True

    def __post_init__(self) -> None:
        own = "MechanismConfig"
        for name in ("variants", "deep_variants"):
            for v in getattr(self, name):
                if v not in STUDY_VARIANTS:
                    raise ConfigError(f"{own}.{name}: {v!r} is not allowed; choose from {', '.join(STUDY_VARIANTS)}")
        if not self.variants:
            raise ConfigError(f"{own}.variants is empty; choose from {', '.join(STUDY_VARIANTS)}")
        if "baseline" not in self.variants:
            raise ConfigError(f"{own}.variants must include 'baseline' (every claim compares against it)")
        if not self.depths or any(not isinstance(d, int) or d < 1 for d in self.depths):
            raise ConfigError(f"{own}.depths={self.depths} must be layer counts >= 1")
        for name in ("seeds", "steps", "seq_len", "micro_batch", "evals", "analysis_sequences", "workers",
                     "n_chars", "n_triggers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{own}.{name}={getattr(self, name)!r} must be > 0")
        if self.lr <= 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ConfigError(f"{own}: lr must be > 0, weight_decay and warmup_steps >= 0")

    @classmethod
    def quick(cls, **changes: Any) -> "MechanismConfig":
        """Under a minute on a 2-core CPU: the whole pipeline, no claim expected to hold."""
        base = dict(variants=("baseline", "gated"), depths=(1,), deep_variants=(), seeds=1, steps=150,
                    micro_batch=8, warmup_steps=10, evals=3, analysis_sequences=32, workers=1,
                    out_dir="runs/reproduce-mechanism-quick")
        return cls(**{**base, **changes})

    def plan(self) -> list[tuple[str, int, int]]:
        """Every run as (variant, depth, seed), the longest (deepest) first."""
        runs = [(v, d, s) for d in self.depths for v in (self.variants if d == self.depths[0] else
                                                            [v for v in self.variants if v in self.deep_variants])
                for s in range(self.seeds)]
        return sorted(runs, key=lambda r: -r[1])

    def task(self) -> BigramBackcopy:
        return BigramBackcopy.default(n_chars=self.n_chars, n_triggers=self.n_triggers)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------ the trainer seam
def train_model(cfg: MechanismConfig, data_dir: Path, run_dir: Path, variant: str, depth: int, seed: int,
                eval_hook) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train one model with the project's trainer; return it and what the trainer reports.

    The only place this study touches the trainer's API."""
    from gatedattn.model import GatedLM
    from gatedattn.train import ModelRecipe, TrainConfig, train

    tcfg = TrainConfig(
        data_dir=str(data_dir), out_dir=str(run_dir),
        model=ModelRecipe(size="toy", variant=variant, lm={"n_layers": depth}, attention={"qk_norm": False}),
        seq_len=cfg.seq_len, micro_batch=cfg.micro_batch, steps=cfg.steps, lr=cfg.lr,
        warmup_steps=min(cfg.warmup_steps, cfg.steps // 5), weight_decay=cfg.weight_decay, dtype="fp32", seed=seed,
        eval_every=max(cfg.steps // cfg.evals, 1), eval_batches=2, ckpt_every=0, log_every=50,
        progress=False, tensorboard=False,
    )
    result = train(tcfg, eval_hook=eval_hook, resume=True)
    if result.final_dir is None:
        raise RuntimeError(f"{run_dir}: training stopped early ({result.diverged_reason})")
    info = {"final_loss": result.final_loss, "val_loss": result.val_loss, "train_seconds": result.elapsed_s,
            "diverged": result.diverged}
    return GatedLM.from_pretrained(result.final_dir), info


# ------------------------------------------------------------------------------ one run
def _curve_hook(task: BigramBackcopy, batch):
    def hook(model, step, tokens):
        m = measure(getattr(model, "module", model), batch, task)
        return {f"mech_{k}": m[k] for k in CURVE_KEYS if m.get(k) is not None and math.isfinite(m[k])}

    return hook


def run_one(cfg: MechanismConfig, data_dir: str, out: str, variant: str, depth: int, seed: int) -> dict[str, Any]:
    """Train and measure one (variant, depth, seed); reuses a finished run's record."""
    torch.set_num_threads(1)
    run_dir = Path(out) / "runs" / f"{variant}-L{depth}-s{seed}"
    record_path = run_dir / "mechanism.json"
    if record_path.is_file():
        return read_json_object(record_path)
    task = cfg.task()
    curve_batch = task.sample(32, cfg.seq_len, seed=ANALYSIS_SEED + 1)
    t0 = time.perf_counter()
    model, info = train_model(cfg, Path(data_dir), run_dir, variant, depth, seed, _curve_hook(task, curve_batch))
    model.eval()
    final = measure(model, task.sample(cfg.analysis_sequences, cfg.seq_len, seed=ANALYSIS_SEED), task)
    curve: dict[str, list] = {"step": []}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "eval":
            curve["step"].append(rec["step"])
            for k in CURVE_KEYS:
                curve.setdefault(k, []).append(rec.get(f"mech_{k}"))
    record = {"variant": variant, "depth": depth, "seed": seed, **info, "wall_seconds": time.perf_counter() - t0,
              "final": final, "curve": curve}
    atomic_write_json(record_path, json_safe(record))
    return record


# ------------------------------------------------------------------------------ the study
def run_study(cfg: MechanismConfig, command: str | None = None) -> Path:
    """Run every training of ``cfg``, judge the claims, write the report; returns report.md."""
    from gatedattn.reproduce.mechanism_report import write_mechanism_report

    started = time.time()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = cfg.task()
    data_dir = out / "data"
    manifest = data_dir / "manifest.json"
    if not manifest.is_file() or task.fingerprint() not in read_json_object(manifest).get("source", ""):
        task.write_data_dir(data_dir, seed=0)
    plan = cfg.plan()
    _say(f"{len(plan)} runs of {cfg.steps} steps ({cfg.workers} at a time): {task.describe()}")
    records: list[dict[str, Any]] = []
    if cfg.workers == 1:
        for i, (v, d, s) in enumerate(plan):
            records.append(run_one(cfg, str(data_dir), str(out), v, d, s))
            _say(f"[{i + 1}/{len(plan)}] {v} L{d} seed {s} done")
    else:
        with ProcessPoolExecutor(max_workers=cfg.workers) as pool:
            futures = [pool.submit(run_one, cfg, str(data_dir), str(out), v, d, s) for v, d, s in plan]
            for i, f in enumerate(futures):
                records.append(f.result())
                _say(f"[{i + 1}/{len(plan)}] {plan[i][0]} L{plan[i][1]} seed {plan[i][2]} done")
    results = build_results(cfg, task, records)
    results["meta"] = _meta(cfg, command, started)
    atomic_write_json(out / "results.json", json_safe(results))
    return write_mechanism_report(results, out)


def build_results(cfg: MechanismConfig, task: BigramBackcopy, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Summaries per depth and variant (mean, std, per-seed values) and the claims."""
    n_after_bos = cfg.seq_len - 1
    depths: dict[str, Any] = {}
    for depth in cfg.depths:
        by_variant: dict[str, list[dict]] = {}
        for r in sorted(records, key=lambda r: r["seed"]):
            if r["depth"] == depth:
                by_variant.setdefault(r["variant"], []).append(r)
        summary = {v: summarize([r["final"] for r in runs]) for v, runs in by_variant.items()}
        for v, runs in by_variant.items():
            summary[v]["final_train_loss"] = _stat([r["final_loss"] for r in runs])
        view = {"summary": summary, "config": {"seq_len": cfg.seq_len}}
        depths[str(depth)] = {"summary": summary, "claims": judge_mechanism(view),
                              "runs": {v: [{k: r[k] for k in ("seed", "curve", "final_loss", "wall_seconds", "train_seconds")}
                                           for r in runs] for v, runs in by_variant.items()}}
    first = records[0]["final"] if records else {}
    return {
        "study": "mechanism",
        "config": cfg.to_dict(),
        "task": {"description": task.describe(), "chars": list(task.chars),
                 "triggers": [task.chars[t] for t in task.triggers], "fingerprint": task.fingerprint(),
                 "trigger_fraction": first.get("trigger_fraction"),
                 "uniform_f_attn": uniform_first_token_attention(n_after_bos),
                 "uniform_bos_attn_ordinary": first.get("uniform_bos_attn_ordinary"),
                 "uniform_bos_attn_trigger": first.get("uniform_bos_attn_trigger")},
        "depths": depths,
        "run_minutes": sum(r["wall_seconds"] for r in records) / 60,
    }


def _stat(values: list[float | None]) -> dict[str, Any] | None:
    if not values or any(v is None for v in values):
        return None
    mean, std = mean_std(values)
    return {"mean": mean, "std": None if math.isnan(std) else std, "values": [float(v) for v in values]}


def summarize(finals: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: _stat([f.get(k) for f in finals]) for k in SUMMARY_KEYS}


# ------------------------------------------------------------------------------ claims
SINK_SHARE = 0.5  # the sink the task is known for: at least half of an ordinary position's attention
REMOVAL_RATIO = 0.5  # "removes": at most half of the baseline's BOS attention


def _sink_forms(results: dict) -> Verdict:
    m = results.get("summary", {}).get("baseline", {}).get("bos_attn_ordinary")
    if not m:
        return Verdict(NOT_MEASURABLE, "`baseline` was not part of this run")
    level = results["summary"]["baseline"].get("uniform_bos_attn_ordinary")
    uniform = level["mean"] if level else uniform_first_token_attention(results["config"]["seq_len"] - 1)
    trig = results["summary"]["baseline"].get("bos_attn_trigger")
    text = (f"BOS attention of ordinary positions {_fmt(m)} = {m['mean'] / uniform:.1f}× the uniform level "
            f"({uniform:.3f})" + (f"; trigger positions {_fmt(trig)}" if trig else ""))
    if m["mean"] >= SINK_SHARE:
        return Verdict(HELD, text)
    return Verdict(NOT_HELD, text + f"; below the {SINK_SHARE:g} the task is known for")


def _removes(variant: str):
    def judge(results: dict) -> Verdict:
        shown = sink_shown(results)
        if shown is not None:
            return Verdict(NOT_MEASURABLE, shown)
        return compare(results, variant, "baseline", "bos_attn_ordinary", min_ratio=REMOVAL_RATIO,
                       label="BOS attention of ordinary positions")

    return judge


def _selective(variant: str):
    def judge(results: dict) -> Verdict:
        verdict = compare_metrics(results, variant, "gate_trigger", "gate_ordinary",
                                  label=f"`{variant}` gate score, trigger vs ordinary positions")
        m = results.get("summary", {}).get(variant, {})
        if verdict.status == HELD and m["gate_ordinary"]["mean"] > 0.5 * m["gate_trigger"]["mean"]:
            return Verdict(NOT_HELD, verdict.measured + "; higher on triggers, but not closed elsewhere "
                                                        "(ordinary above half the trigger score)")
        return verdict

    return judge


def _learnable_sink(results: dict) -> Verdict:
    shown = sink_shown(results)
    if shown is not None:
        return Verdict(NOT_MEASURABLE, shown)
    verdict = compare(results, "sink", "baseline", "bos_attn_ordinary", min_ratio=REMOVAL_RATIO,
                      label="BOS attention of ordinary positions")
    mass = results["summary"].get("sink", {}).get("sink_mass_ordinary")
    base = results["summary"]["baseline"]["bos_attn_ordinary"]
    if verdict.status != HELD or mass is None:
        return verdict
    text = verdict.measured + f"; learnable-sink mass on ordinary positions {_fmt(mass)}"
    if mass["mean"] >= 0.5 * base["mean"]:
        return Verdict(HELD, text)
    return Verdict(NOT_HELD, text + ", under half the baseline's BOS attention: the mass went elsewhere")


# (key, claim, variants it needs, judge)
MECHANISM_CLAIMS: list[tuple[str, str, tuple[str, ...], Any]] = [
    ("mech-sink", "The baseline's ordinary positions attend to BOS (≥ 0.5 of their attention)", ("baseline",),
     _sink_forms),
    *[(f"mech-removes-{v}", f"`{v}` removes the sink (≤ 0.5× the baseline's BOS attention)", ("baseline", v),
       _removes(v)) for v in GATED],
    *[(f"mech-selective-{v}", f"`{v}`'s gate opens on triggers and closes elsewhere", (v,), _selective(v))
      for v in GATED],
    ("mech-learnable-sink", "The learnable sink takes the sink's role (`sink`)", ("baseline", "sink"),
     _learnable_sink),
]


def judge_mechanism(results: dict) -> list[dict[str, str]]:
    """One row per claim whose variants ran: key, claim, verdict, what was measured."""
    present = set(results.get("summary", {}))
    rows = []
    for key, statement, needs, judge in MECHANISM_CLAIMS:
        if not set(needs) <= present:
            continue
        verdict = judge(results)
        rows.append({"key": key, "claim": statement, "verdict": verdict.status, "measured": verdict.measured})
    return rows


# ------------------------------------------------------------------------------ helpers
def _say(msg: str) -> None:
    print(f"[mechanism] {msg}", file=sys.stderr, flush=True)


def _meta(cfg: MechanismConfig, command: str | None, started: float) -> dict[str, Any]:
    from gatedattn.reproduce.runner import code_version, machine_description

    return {
        "command": command or "gatedattn reproduce --study mechanism",
        "machine": machine_description(), "python": platform.python_version(), "torch": torch.__version__,
        "gatedattn": __version__, "code_version": code_version(),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_min": (time.time() - started) / 60,
    }

