"""The mechanism study's training: each (variant, depth, seed) trained with the project's
trainer on the generated task and measured (:mod:`.probe`) along training and at the
end, reused by a second call under the same recipe; the study alone
(:func:`run_study`) and as a part of the main job (:func:`run_part`)."""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.infra.provenance import run_meta, say
from gatedattn.models.lm import GatedLM
from gatedattn.reproduce.batch import Record, Run, check_interrupted, run_batch
from gatedattn.reproduce.mechanism.config import MODEL_INIT_STD, NAME, SINKS, TOY_MLP_RATIO, POSITIONS, MechanismConfig
from gatedattn.reproduce.mechanism.probe import measure
from gatedattn.reproduce.mechanism.report import write_mechanism_report
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.mechanism.summary import build_results
from gatedattn.train import ModelRecipe, TrainConfig, train

ANALYSIS_SEED = 10_000  # analysis sequences are drawn apart from the training data
CURVE_KEYS = ("bos_attn_ordinary", "bos_attn_trigger", "prev_attn_trigger", "gate_ordinary", "gate_trigger",
              "sink_mass_ordinary", "sink_logit", "loss_copy", "loss_bigram", "resid_norm_bos", "value_norm_bos", "value_norm_other")


# ------------------------------------------------------------------------------ the trainer seam
def train_config(cfg: MechanismConfig, data_dir: Path, run_dir: Path, variant: str, depth: int,
                 seed: int) -> "TrainConfig":
    """The trainer's config of one run of the study."""
    attention = {"qk_norm": False, "qkv_bias": cfg.qkv_bias}
    if variant in SINKS and cfg.sink_init:
        attention["sink_init"] = cfg.sink_init
    recipe = ModelRecipe(
        size="toy", variant=variant, d_model=cfg.d_model,
        lm={"n_layers": depth, "norm": cfg.norm, "tie_embeddings": cfg.tie_embeddings, "embed_std": cfg.embed_std,
            "position_embedding": "learned" if cfg.positions == "learned" else "none",
            **({"mlp": cfg.mlp} if cfg.mlp != "swiglu" else {}),  # a run recorded before the field: swiglu
            **({"ffn_dim": cfg.mlp_ratio * cfg.d_model} if cfg.mlp_ratio != TOY_MLP_RATIO else {}),
            **({"init_std": cfg.init_std} if cfg.init_std != MODEL_INIT_STD else {})},
        attention=attention, rope={"fraction": POSITIONS[cfg.positions]})
    return TrainConfig(
        data_dir=str(data_dir), out_dir=str(run_dir), model=recipe,
        seq_len=cfg.seq_len, micro_batch=cfg.micro_batch, steps=cfg.steps, lr=cfg.lr,
        warmup_steps=cfg.warmup, schedule=cfg.schedule, betas=(0.9, cfg.beta2),
        weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, dtype="fp32", seed=seed,
        eval_every=max(cfg.steps // cfg.evals, 1), eval_batches=2, ckpt_every=0, log_every=50,
        progress=False, tensorboard=False, compile="off",  # tiny models; the same on every machine
    )


def train_model(cfg: MechanismConfig, data_dir: Path, run_dir: Path, variant: str, depth: int, seed: int,
                eval_hook) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train one model with the project's trainer; return it and what the trainer reports.

    The only place this study touches the trainer's API."""
    result = train(train_config(cfg, data_dir, run_dir, variant, depth, seed), eval_hook=eval_hook, resume=True)
    check_interrupted(result, run_dir.name)
    if result.final_dir is None:
        raise RuntimeError(f"{run_dir}: training stopped early ({result.diverged_reason})")
    info = {"final_loss": result.final_loss, "val_loss": result.val_loss, "train_seconds": result.elapsed_s,
            "diverged": result.diverged}
    return GatedLM.from_pretrained(result.final_dir), info


def model_parameters(cfg: MechanismConfig, variant: str, depth: int) -> int:
    """Parameters of one run's model (built on the meta device: no weights drawn)."""
    task = cfg.task()
    model_cfg = train_config(cfg, Path("."), Path("."), variant, depth, 0).model.build(
        vocab_size=task.vocab_size, max_seq_len=cfg.seq_len + 1, bos_token_id=task.bos_id)
    with torch.device("meta"):
        model = GatedLM(model_cfg)
    return sum(p.numel() for p in model.parameters())


def training_work(cfg: MechanismConfig) -> int:
    """The study's training work: over its runs, steps x sequences x tokens x parameters
    (what its training time is proportional to on one machine)."""
    sizes: dict[tuple[str, int], int] = {}
    total = 0
    for v, d, _ in cfg.plan():
        if (v, d) not in sizes:
            sizes[v, d] = model_parameters(cfg, v, d)
        total += cfg.steps * cfg.micro_batch * cfg.seq_len * sizes[v, d]
    return total


# ------------------------------------------------------------------------------ one run
def _curve_hook(task: BigramBackcopy, batch):
    def hook(model, step, tokens):
        m = measure(getattr(model, "module", model), batch, task)
        return {f"mech_{k}": m[k] for k in CURVE_KEYS if m.get(k) is not None and math.isfinite(m[k])}

    return hook


def mechanism_run(cfg: MechanismConfig, data_dir: Path, out: Path, variant: str, depth: int, seed: int,
                  name: str | None = None) -> Run:
    """One (variant, depth, seed) of a batch: trained into ``out/runs/<variant>-L<depth>-s<seed>``
    and measured; its record (``mechanism.json``) is reused under the same recipe only."""
    run_dir = out / "runs" / f"{variant}-L{depth}-s{seed}"
    recipe = json_safe(recipe_of(cfg, variant))
    record = Record(run_dir / "mechanism.json", recipe, key_at="recipe", defaults=LATER_RECIPE_FIELDS,
                    refuse="give another --out (the study reuses finished runs of the same recipe only)")
    return Run(name or run_dir.name, functools.partial(_train_and_measure, cfg, data_dir, run_dir, variant, depth, seed,
                                                        recipe), record)


def _train_and_measure(cfg: MechanismConfig, data_dir: Path, run_dir: Path, variant: str, depth: int, seed: int,
                       recipe: dict[str, Any]) -> dict[str, Any]:
    """Train and measure one (variant, depth, seed); its record."""
    task = cfg.task()
    curve_batch = task.sample(32, cfg.seq_len, seed=ANALYSIS_SEED + 1)
    t0 = time.perf_counter()
    model, info = train_model(cfg, data_dir, run_dir, variant, depth, seed, _curve_hook(task, curve_batch))
    model.eval()
    final = measure(model, task.sample(cfg.analysis_sequences, cfg.seq_len, seed=ANALYSIS_SEED), task)
    curve: dict[str, list] = {"step": []}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "eval":
            curve["step"].append(rec["step"])
            for k in CURVE_KEYS:
                curve.setdefault(k, []).append(rec.get(f"mech_{k}"))
    return {"variant": variant, "depth": depth, "seed": seed, "recipe": recipe, **info,
            "wall_seconds": time.perf_counter() - t0, "final": final, "curve": curve}


# ------------------------------------------------------------------------------ the study
def ensure_task_data(cfg: MechanismConfig, out: Path) -> Path:
    """The generated task as a data directory ``out/data`` (made once per language and
    stream length; the trainer reads it like any prepared corpus)."""
    task = cfg.task()
    data_dir = out / "data"
    manifest = data_dir / "manifest.json"
    if manifest.is_file():
        saved = read_json_object(manifest)
        if task.fingerprint() in saved.get("source", "") and saved.get("train", {}).get("tokens") == cfg.train_tokens:
            return data_dir
    task.write_data_dir(data_dir, train_tokens=cfg.train_tokens, seed=0)
    return data_dir


def run_results(cfg: MechanismConfig) -> MechanismResults:
    """Train (or reuse) every run of ``cfg`` in ``cfg.out_dir``; the study's results (the
    summaries per depth and variant, judged)."""
    return build_results(cfg, cfg.task(), train_runs(cfg, Path(cfg.out_dir)))


def run_part(cfg: MechanismConfig, out: Path) -> MechanismResults:
    """The study as a part of the main job, in ``out/mechanism`` (its runs are reused by a
    second call); its results, with the wall time it took."""
    started = time.time()
    cfg = cfg.replace(out_dir=str(out / "mechanism"), progress=True)
    say("reproduce", f"the mechanism study ({len(cfg.plan())} runs of {cfg.steps} steps, {cfg.workers} at a time)")
    return run_results(cfg).replace(minutes=(time.time() - started) / 60)


def train_runs(cfg: MechanismConfig, out: Path) -> list[dict[str, Any]]:
    """Train (or reuse) every run of ``cfg`` under ``out``; their records in plan order."""
    out.mkdir(parents=True, exist_ok=True)
    data_dir = ensure_task_data(cfg, out)
    plan = cfg.plan()
    if cfg.progress:
        say(NAME, f"{len(plan)} runs of {cfg.steps} steps ({cfg.workers} at a time) in {out}: {cfg.task().describe()}")
    return run_batch([mechanism_run(cfg, data_dir, out, v, d, s) for v, d, s in plan], workers=cfg.workers,
                     threads=1, label="mechanism", progress=_progress if cfg.progress else None)


def _progress(i: int, record: dict[str, Any]) -> str:
    return (f"{record['variant']} L{record['depth']} seed {record['seed']}: BOS attention of ordinary positions "
            f"{record['final']['bos_attn_ordinary']:.3f}")


RECIPE_FIELDS = ("steps", "seq_len", "micro_batch", "d_model", "positions", "norm", "mlp", "mlp_ratio", "qkv_bias",
                 "tie_embeddings", "embed_std", "init_std", "lr", "schedule", "warmup_steps", "beta2", "weight_decay", "grad_clip",
                 "train_tokens", "task_family", "n_chars", "n_triggers", "trigger_share", "successors", "task_seed",
                 "evals", "analysis_sequences")


# recipe fields added after runs were first recorded, with the value those runs had
LATER_RECIPE_FIELDS: dict[str, Any] = {"sink_init": 0.0, "task_family": "corpus", "trigger_share": 0.2,
                                       "successors": 4, "task_seed": 0, "mlp": "swiglu",
                                       "mlp_ratio": TOY_MLP_RATIO, "init_std": MODEL_INIT_STD}


def recipe_of(cfg: MechanismConfig, variant: str | None = None) -> dict[str, Any]:
    """The fields that decide what one run (of ``variant``) trains and measures (a
    finished run is reused only under the same recipe); the sink's initial logit counts
    for the variants with a sink only."""
    recipe = {k: getattr(cfg, k) for k in RECIPE_FIELDS}
    recipe["sink_init"] = cfg.sink_init if variant in SINKS else 0.0
    return recipe


def run_study(cfg: MechanismConfig, command: str | None = None) -> Path:
    """Run every training of ``cfg``, judge the claims, write the report; returns report.md."""
    started = time.time()
    results = run_results(cfg)
    results = results.replace(meta=run_meta(command or MechanismConfig.command(), started))
    atomic_write_json(Path(cfg.out_dir) / "results.json", json_safe(results.to_dict()))
    return write_mechanism_report(results, cfg.out_dir)
