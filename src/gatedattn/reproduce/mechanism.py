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

A second call with the same ``out`` reuses finished runs. :func:`run_results` trains and
summarises; :func:`run_part` is the study as a part of the main job, and
:func:`gatedattn.reproduce.mechanism_report.run_study` the study alone with its report.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn import paper as P
from gatedattn.analysis.metrics import seed_stat
from gatedattn.analysis.registry import MECHANISM_METRICS, keys
from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fmt import fmt_mean_std as _fmt
from gatedattn.infra.io import json_safe, read_json_object
from gatedattn.reproduce.verdicts import (
    HELD, NOT_HELD, NOT_MEASURABLE, Claim, Verdict, compare, compare_metrics,
    uniform_first_token_attention,
)
from gatedattn.models.lm import MLPS, SIZE_PRESETS, GatedLM, ModelConfig
from gatedattn.infra.provenance import run_meta, say
from gatedattn.reproduce.mechanism_probe import measure
from gatedattn.infra.settings import build, check_options, option
from gatedattn.train import ModelRecipe, TrainConfig, train
from gatedattn.reproduce.batch import Record, Run, check_interrupted, run_batch
from gatedattn.reproduce.registry import Flag, list_of, out_flag, quiet_flag

STUDY_VARIANTS = ("baseline", "gated", "gated-headwise", "sink", "hyga", "hyga-lowrank", "hyga-sink", "hyga-h", "hyga-c")
GATED = ("gated", "gated-headwise", "hyga", "hyga-lowrank", "hyga-sink", "hyga-h", "hyga-c")
SINKS = ("sink", "hyga-sink")  # the variants with a learnable sink
ANALYSIS_SEED = 10_000  # analysis sequences are drawn apart from the training data
CURVE_KEYS = ("bos_attn_ordinary", "bos_attn_trigger", "prev_attn_trigger", "gate_ordinary", "gate_trigger",
              "sink_mass_ordinary", "sink_logit", "loss_copy", "loss_bigram", "resid_norm_bos", "value_norm_bos", "value_norm_other")
SUMMARY_KEYS = keys(MECHANISM_METRICS)


POSITIONS = {"rope": 1.0, "partial-rope": 0.5, "learned": 0.0}  # name -> share of each head's channels that rotate
NORMS = ("layer", "rms")
MLP_WORDS = {"relu": "ReLU", "gelu": "GELU"}  # the two-matrix MLPs, as the recipe line names them
TASK_FAMILIES = ("corpus", "random")
SCHEDULES = ("constant", "cosine")
TOY_MLP_RATIO = SIZE_PRESETS["toy"][4] // SIZE_PRESETS["toy"][1]  # the toy preset's MLP width / d_model (2)
MODEL_INIT_STD = ModelConfig.__dataclass_fields__["init_std"].default  # the model's own weight scale (0.02)

@dataclass(frozen=True)
class MechanismConfig:
    """One mechanism study. Every variant in ``variants`` trains at ``depths[0]`` layers;
    the deeper ``depths`` train only the ``deep_variants``. ``seeds`` runs of each at the
    first depth, ``deep_seeds`` (capped at ``seeds``) at the deeper ones.

    The recipe fields (``d_model`` to ``train_tokens``) are the calibration's levers
    (:mod:`gatedattn.reproduce.mechanism_calibration`, docs/mechanism-calibration). The
    defaults are the recipe it found to grow the full first-token sink (BOS attention of
    ordinary positions above 0.5) fastest on a 2-core CPU, close to the Bigram-Backcopy
    reference setting: learned absolute positions and no rotary ones, LayerNorm with
    bias, q/k/v biases, untied embeddings drawn from N(0, 1), AdamW with beta2 0.99 at a
    constant learning rate, no clipping, and a fresh stream of text for every step."""

    variants: tuple[str, ...] = option(("baseline", "gated", "sink", "hyga", "hyga-lowrank", "hyga-sink"),
                                       choices=STUDY_VARIANTS, help="variants at the first depth")
    depths: tuple[int, ...] = option((1, 2), ge=1, le=256, help="layer counts; the deeper ones train only deep_variants")
    deep_variants: tuple[str, ...] = option(("baseline", "gated"), choices=STUDY_VARIANTS, help="variants trained at the deeper depths")
    seeds: int = option(5, gt=0, le=1000, help="seeds of every variant at the first depth")
    deep_seeds: int = option(3, gt=0, le=1000, help="seeds of every variant at the deeper depths (capped at seeds)")
    steps: int = option(1200, gt=0, le=10_000_000, help="optimizer steps of every run")
    seq_len: int = option(64, gt=0, le=65_536, help="tokens per sequence after BOS")
    micro_batch: int = option(32, gt=0, le=65_536, help="sequences per step")
    d_model: int = option(64, gt=0, le=65_536, help="width (one head of d_model channels)")
    mlp_ratio: int = option(TOY_MLP_RATIO, gt=0, le=64, help="the MLP's hidden width in multiples of d_model")
    positions: str = option("learned", choices=tuple(POSITIONS), help="position encoding: " + ", ".join(POSITIONS) +
                            " (learned absolute positions, GPT-2 style, with no rotation)")
    norm: str = option("layer", choices=NORMS, help="layer (LayerNorm with bias) or rms (RMSNorm)")
    mlp: str = option("swiglu", choices=MLPS, help="the MLP: swiglu (no biases), or relu / gelu (two matrices with "
                                                  "biases, as OPT / GPT-2)")
    qkv_bias: bool = option(True, help="biases on the q/k/v projections")
    tie_embeddings: bool = option(False, help="the LM head shares the token embedding")
    embed_std: float = option(1.0, gt=0, help="standard deviation of the initial embeddings")
    init_std: float = option(MODEL_INIT_STD, gt=0, help="standard deviation of the initial weight matrices (PyTorch's default "
                                              "nn.Linear init has 1/sqrt(3 d_model): 0.072 at d_model 64)")
    lr: float = option(3e-3, gt=0, help="peak learning rate")
    schedule: str = option("constant", choices=SCHEDULES, help="after warm-up: constant, or cosine down to a tenth")
    warmup_steps: int = option(30, ge=0, le=10_000_000, help="linear warm-up steps")
    beta2: float = option(0.99, gt=0, lt=1, help="AdamW beta2 (beta1 0.9)")
    weight_decay: float = option(1e-4, ge=0, help="AdamW weight decay")
    grad_clip: float = option(0.0, ge=0, help="gradient-norm clipping (0: none)")
    sink_init: float = option(0.0, help="initial logit of the learnable sink of " + ", ".join(SINKS) +
                              " (0: it weighs as one key of score 0)")
    train_tokens: int = option(1 << 22, gt=0, le=1 << 34, help="length of the generated training stream; at least the tokens a "
                                             "run trains keeps every window fresh text, less re-reads it")
    task_family: str = option("corpus", choices=TASK_FAMILIES, help="the bigram table: corpus (the default "
                              "corpus's character bigrams) or random (a random sparse table)")
    n_chars: int = option(24, gt=0, le=65_536, help="characters of the language (the bigram table's size, triggers included)")
    n_triggers: int = option(3, gt=0, le=65_536, help="trigger characters (corpus: the most frequent after the space)")
    trigger_share: float = option(0.2, gt=0, lt=0.5, help="random family: the share of positions that are triggers")
    successors: int = option(4, gt=0, le=65_536, help="random family: ordinary successors of each character")
    task_seed: int = option(0, ge=0, help="random family: the seed of the table")
    evals: int = option(10, gt=0, le=100_000, help="measurements along training (the curves)")
    analysis_sequences: int = option(256, gt=0, le=1_000_000, help="sequences of the final measurement")
    workers: int = option(2, gt=0, le=1024, help="runs trained at a time (one thread each)")
    out_dir: str = option("runs/reproduce-mechanism", help="output directory")
    progress: bool = option(True, help="progress messages")

    def __post_init__(self) -> None:
        own = "MechanismConfig"
        for name in ("variants", "deep_variants", "depths"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_options(self)
        if not self.variants or not self.depths:
            raise ConfigError(f"{own}.variants and depths must not be empty")
        if "baseline" not in self.variants:
            raise ConfigError(f"{own}.variants must include 'baseline' (every claim compares against it)")
        if self.task_family == "random":
            self.task()  # the table's fields are checked now, before any run
        if self.train_tokens < self.seq_len + 1:
            raise ConfigError(f"{own}.train_tokens={self.train_tokens} must exceed seq_len={self.seq_len}")

    @classmethod
    def quick(cls, **changes: Any) -> "MechanismConfig":
        """Under half a minute on a 2-core CPU: the whole pipeline, one seed, one depth."""
        base = dict(variants=("baseline", "gated"), depths=(1,), deep_variants=(), seeds=1, deep_seeds=1, steps=150,
                    micro_batch=16, warmup_steps=10, evals=3, analysis_sequences=32, workers=1,
                    train_tokens=1 << 18, out_dir="runs/reproduce-mechanism-quick")
        return cls(**{**base, **changes})

    def replace(self, **changes: Any) -> "MechanismConfig":
        return dataclasses.replace(self, **changes)

    def plan(self) -> list[tuple[str, int, int]]:
        """Every run as (variant, depth, seed), the longest (deepest) first."""
        first = self.depths[0]
        runs = [(v, d, s) for d in self.depths for v in (self.variants if d == first else
                                                            [v for v in self.variants if v in self.deep_variants])
                for s in range(self.seeds if d == first else min(self.deep_seeds, self.seeds))]
        return sorted(runs, key=lambda r: -r[1])

    def task(self) -> BigramBackcopy:
        if self.task_family == "random":
            return BigramBackcopy.random_sparse(n_chars=self.n_chars, n_triggers=self.n_triggers,
                                                trigger_share=self.trigger_share, successors=self.successors,
                                                seed=self.task_seed)
        return BigramBackcopy.default(n_chars=self.n_chars, n_triggers=self.n_triggers)

    @property
    def warmup(self) -> int:
        """The warm-up steps a run gets: ``warmup_steps``, at most a fifth of the run."""
        return min(self.warmup_steps, self.steps // 5)

    def tokens_per_run(self) -> int:
        return self.steps * self.micro_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MechanismConfig":
        return build(cls, data)

    def describe(self) -> str:
        """The recipe in words (the report's setup row)."""
        return (f"d_model {self.d_model}, one head, {self.positions} positions, "
                f"{'LayerNorm' if self.norm == 'layer' else 'RMSNorm'}, q/k/v bias {'on' if self.qkv_bias else 'off'}, "
                f"{'tied' if self.tie_embeddings else 'untied'} embeddings N(0, {self.embed_std:g}), "
                + (f"weight matrices N(0, {self.init_std:g}), " if self.init_std != MODEL_INIT_STD else "") + "no q/k norm; "
                f"{self.steps} steps of {self.micro_batch} x {self.seq_len} tokens "
                f"({self.tokens_per_run() / 1e6:.2f} M), AdamW (0.9, {self.beta2:g}), LR {self.lr:g} {self.schedule} "
                f"after {self.warmup} warm-up steps, weight decay {self.weight_decay:g}, "
                f"clipping {self.grad_clip:g}, a {self.train_tokens / 1e6:.2f} M-token training stream"
                + (f"; the learnable sinks start at logit {self.sink_init:g}" if self.sink_init else "")
                + (f"; a {MLP_WORDS[self.mlp]} MLP with biases" if self.mlp != "swiglu" else "")
                + (f"; the MLP {self.mlp_ratio}× d_model wide" if self.mlp_ratio != TOY_MLP_RATIO else ""))


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


def run_results(cfg: MechanismConfig) -> dict[str, Any]:
    """Train (or reuse) every run of ``cfg`` in ``cfg.out_dir``; the study's results (the
    summaries per depth and variant, judged)."""
    return build_results(cfg, cfg.task(), train_runs(cfg, Path(cfg.out_dir)))


def run_part(cfg: MechanismConfig, out: Path) -> dict[str, Any]:
    """The study as a part of the main job, in ``out/mechanism`` (its runs are reused by a
    second call); its results, with the wall time it took."""
    started = time.time()
    cfg = cfg.replace(out_dir=str(out / "mechanism"), progress=True)
    say("reproduce", f"the mechanism study ({len(cfg.plan())} runs of {cfg.steps} steps, {cfg.workers} at a time)")
    results = run_results(cfg)
    results["minutes"] = (time.time() - started) / 60
    return results


def train_runs(cfg: MechanismConfig, out: Path) -> list[dict[str, Any]]:
    """Train (or reuse) every run of ``cfg`` under ``out``; their records in plan order."""
    out.mkdir(parents=True, exist_ok=True)
    data_dir = ensure_task_data(cfg, out)
    plan = cfg.plan()
    if cfg.progress:
        _say(f"{len(plan)} runs of {cfg.steps} steps ({cfg.workers} at a time) in {out}: {cfg.task().describe()}")
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


def build_results(cfg: MechanismConfig, task: BigramBackcopy, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Summaries per depth and variant (mean, std, per-seed values) and the claims."""
    n_after_bos = cfg.seq_len - 1
    depths = {str(depth): depth_block(cfg, [r for r in records if r["depth"] == depth]) for depth in cfg.depths}
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


# ------------------------------------------------------------------------------ claims
SINK_SHARE = 0.5  # the sink the task is known for: at least half of an ordinary position's attention
REMOVAL_RATIO = 0.5  # "removes": at most half of the baseline's BOS attention


def _uniform(results: dict) -> float:
    level = results["summary"]["baseline"].get("uniform_bos_attn_ordinary")
    return level["mean"] if level else uniform_first_token_attention(results["config"]["seq_len"] - 1)


def _sink_forms(results: dict) -> Verdict:
    m = results.get("summary", {}).get("baseline", {}).get("bos_attn_ordinary")
    if not m:
        return Verdict(NOT_MEASURABLE, "`baseline` was not part of this run")
    uniform = _uniform(results)
    trig = results["summary"]["baseline"].get("bos_attn_trigger")
    text = (f"BOS attention of ordinary positions {_fmt(m)} = {m['mean'] / uniform:.1f}× the uniform level "
            f"({uniform:.3f})" + (f"; trigger positions {_fmt(trig)}" if trig else ""))
    seeds = m.get("values") or [m["mean"]]
    if min(seeds) >= SINK_SHARE:
        return Verdict(HELD, text + f"; every seed ≥ {SINK_SHARE:g} ({', '.join(f'{x:.3f}' for x in seeds)})")
    return Verdict(NOT_HELD, text + f"; seeds {', '.join(f'{x:.3f}' for x in seeds)}, not all at the "
                                    f"{SINK_SHARE:g} the task is known for")


SINKING = 3.0  # a sink to remove: the baseline's BOS attention from ordinary positions >= 3x uniform
DRAIN = 0.5  # value-state drain: ‖v_BOS‖ <= 0.5 x the other tokens'
PEAK = 2.0  # residual-state peak: ‖h_BOS‖ >= 2 x the other tokens'


def mechanism_sink_shown(results: dict) -> str | None:
    """None when the baseline's BOS attention from ordinary positions is at least SINKING x
    the uniform level (the quantity the removal claims are about); else why not."""
    m = results.get("summary", {}).get("baseline", {}).get("bos_attn_ordinary")
    if not m:
        return "`baseline` was not measured"
    uniform = _uniform(results)
    if m["mean"] >= SINKING * uniform:
        return None
    return (f"the baseline shows no sink to remove (BOS attention of ordinary positions {_fmt(m)}, needs ≥ "
            f"{SINKING:g}× uniform = {SINKING * uniform:.3f})")


def _norm_ratio(results: dict, variant: str, kind: str) -> tuple[float, list[float]] | None:
    """Seed-mean and per-seed ‖x_BOS‖ / ‖x_other‖ of ``kind`` (value or resid)."""
    m = results.get("summary", {}).get(variant, {})
    bos, other = m.get(f"{kind}_norm_bos"), m.get(f"{kind}_norm_other")
    if not bos or not other:
        return None
    per_seed = [b / o for b, o in zip(bos["values"], other["values"]) if o]
    return (sum(per_seed) / len(per_seed), per_seed) if per_seed else None


def _norm_claim(kind: str, variant: str | None):
    """The baseline's drain (value) or peak (resid); with ``variant``, whether it vanishes there."""
    label = {"value": ("value-state drain", "‖v_BOS‖ / ‖v_other‖"), "resid": ("residual-state peak",
                                                                             "‖h_BOS‖ / ‖h_other‖")}[kind]

    def holds(ratio: float) -> bool:
        return ratio <= DRAIN if kind == "value" else ratio >= PEAK

    def judge(results: dict) -> Verdict:
        base = _norm_ratio(results, "baseline", kind)
        if base is None:
            return Verdict(NOT_MEASURABLE, f"{label[1]} was not measured")
        text = f"baseline {label[1]} {base[0]:.2f} (seeds {', '.join(f'{x:.2f}' for x in base[1])})"
        if variant is None:
            return Verdict(HELD if all(holds(x) for x in base[1]) else NOT_HELD, text)
        if not all(holds(x) for x in base[1]):
            return Verdict(NOT_MEASURABLE, text + f": the baseline shows no {label[0]} in every seed")
        other = _norm_ratio(results, variant, kind)
        if other is None:
            return Verdict(NOT_MEASURABLE, f"`{variant}` {label[1]} was not measured")
        text += f"; `{variant}` {other[0]:.2f} (seeds {', '.join(f'{x:.2f}' for x in other[1])})"
        return Verdict(HELD if not any(holds(x) for x in other[1]) else NOT_HELD, text)

    return judge


def _removes(variant: str, than: str = "baseline", min_ratio: float | None = REMOVAL_RATIO):
    """``variant`` leaves less BOS attention from ordinary positions than ``than`` (by the
    factor ``min_ratio``, or beyond seed noise where None); judged where the baseline sinks."""
    def judge(results: dict) -> Verdict:
        shown = mechanism_sink_shown(results)
        if shown is not None:
            return Verdict(NOT_MEASURABLE, shown)
        return compare(results, variant, than, "bos_attn_ordinary", min_ratio=min_ratio,
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


def _seeds(stat: dict) -> list[float]:
    return stat.get("values") or [stat["mean"]]


def _per_seed(values: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in values)


def _sink_takes_the_role(variant: str):
    """The learnable sink of ``variant`` takes the sink's role where, in every seed, it
    holds at least half of the baseline's BOS attention (same seed) from ordinary
    positions and BOS keeps at most REMOVAL_RATIO of it. Judged from the sink's share
    itself, so a sink that takes no mass fails the claim even where BOS attention stays
    within seed noise of the baseline's."""

    def judge(results: dict) -> Verdict:
        shown = mechanism_sink_shown(results)
        if shown is not None:
            return Verdict(NOT_MEASURABLE, shown)
        summary = results["summary"]
        mass = summary.get(variant, {}).get("sink_mass_ordinary")
        bos = summary.get(variant, {}).get("bos_attn_ordinary")
        if not mass or not bos:
            return Verdict(NOT_MEASURABLE, f"`{variant}`'s learnable sink was not measured")
        base = summary["baseline"]["bos_attn_ordinary"]
        masses, left, reference = _seeds(mass), _seeds(bos), _seeds(base)
        if len(reference) != len(masses):  # unpaired seeds: against the baseline's mean
            reference = [base["mean"]] * len(masses)
        text = (f"`{variant}`: the sink's share of ordinary positions' attention {_fmt(mass)} (seeds "
                f"{_per_seed(masses)}), BOS attention left {_fmt(bos)} (seeds {_per_seed(left)}); the baseline's "
                f"BOS attention {_fmt(base)} (seeds {_per_seed(_seeds(base))})")
        short = sum(m < 0.5 * r for m, r in zip(masses, reference))
        kept = sum(b > REMOVAL_RATIO * r for b, r in zip(left, reference))
        if not short and not kept:
            return Verdict(HELD, text)
        why = []
        if short:
            why.append(f"in {short} of {len(masses)} seeds the sink takes under half the baseline's BOS attention")
        if kept:
            why.append(f"in {kept} of {len(left)} seeds BOS keeps over {REMOVAL_RATIO:g}× the baseline's")
        return Verdict(NOT_HELD, text + "; " + "; ".join(why))

    return judge


# (key, claim, variants it needs, judge)
SOURCE = "Bigram-Backcopy"  # the mechanism claims' source: the task of Guo et al. 2024 built to show the sink


def _claim(key: str, statement: str, paper: str, needs: tuple[str, ...],
           judge: Callable[[dict], Verdict]) -> Claim:
    return Claim(key, SOURCE, statement, paper, judge, needs)


# what the papers say about each variant's effect on the sink (paper.py's words)
REMOVAL_TEXT = {"gated": P.GA_REMOVES_SINK, "gated-headwise": P.GA_HEADWISE_SINK, "hyga": P.HYGA_SINK_LEFT,
                "hyga-lowrank": P.HYGA_SINK_LEFT, "hyga-sink": P.HYGA_SINK_LEFT, "hyga-h": P.HYGA_H_GATE,
                "hyga-c": P.HYGA_C_GATE}
HYGA_FULL = ("hyga", "hyga-lowrank", "hyga-sink")  # the variants with HyGA's X-gate, H-gate and C-gate



MECHANISM_CLAIMS: list[Claim] = [
    _claim("mech-sink", "The baseline's ordinary positions attend to BOS (≥ 0.5 of their attention)", P.GUO_SINK,
           ("baseline",), _sink_forms),
    _claim("mech-drain", f"The baseline's BOS value vector drains (‖v_BOS‖ ≤ {DRAIN:g}× the others', every seed)",
           P.GUO_DRAIN, ("baseline",), _norm_claim("value", None)),
    _claim("mech-peak", f"The baseline's BOS residual state peaks (‖h_BOS‖ ≥ {PEAK:g}× the others', every seed)",
           P.GUO_PEAK, ("baseline",), _norm_claim("resid", None)),
    *[_claim(f"mech-drain-{v}", f"The value-state drain vanishes with `{v}`", P.GA_REMOVES_SINK, ("baseline", v),
             _norm_claim("value", v)) for v in ("gated",)],
    *[_claim(f"mech-peak-{v}", f"The residual-state peak vanishes with `{v}`", P.GA_REMOVES_MACT, ("baseline", v),
             _norm_claim("resid", v)) for v in ("gated",)],
    *[_claim(f"mech-removes-{v}", f"`{v}` removes the sink (≤ 0.5× the baseline's BOS attention)", REMOVAL_TEXT[v],
             ("baseline", v), _removes(v)) for v in GATED],
    *[_claim(f"mech-below-gated-{v}", f"`{v}` leaves less of the sink than `gated` (BOS attention)", P.HYGA_SINK_LEFT,
             ("baseline", "gated", v), _removes(v, than="gated", min_ratio=None)) for v in HYGA_FULL],
    *[_claim(f"mech-selective-{v}", f"`{v}`'s gate opens on triggers and closes elsewhere", P.GA_SPARSE, (v,),
             _selective(v)) for v in GATED],
    _claim("mech-learnable-sink", "The learnable sink takes the sink's role (`sink`)", P.LEARNABLE_SINK,
           ("baseline", "sink"), _sink_takes_the_role("sink")),
    _claim("mech-learnable-sink-hyga", "HyGA's learnable sink takes the sink's role (`hyga-sink`)", P.LEARNABLE_SINK,
           ("baseline", "hyga-sink"), _sink_takes_the_role("hyga-sink")),
]


def judge_mechanism(results: dict) -> list[dict[str, str]]:
    """One row per claim whose variants ran: key, claim, verdict, what was measured."""
    present = set(results.get("summary", {}))
    rows = []
    for claim in MECHANISM_CLAIMS:
        if not set(claim.needs) <= present:
            continue
        verdict = claim.judge(results)
        rows.append({"key": claim.key, "claim": claim.statement, "paper": claim.paper, "verdict": verdict.status,
                     "measured": verdict.measured})
    return rows


def judge_depths(results: dict[str, Any]) -> dict[str, Any]:
    """A mechanism study's ``results`` with each depth's claims judged anew by the
    current rules (a report written again from results.json)."""
    for block in results.get("depths", {}).values():
        block["claims"] = judge_mechanism({"summary": block["summary"], "config": {"seq_len": results["config"]["seq_len"]}})
    return results


# ------------------------------------------------------------------------------ helpers
def _say(msg: str) -> None:
    say("mechanism", msg)


def study_meta(command: str | None, started: float) -> dict[str, Any]:
    return run_meta(command or "gatedattn reproduce --study mechanism", started)


FLAGS: dict[str, Flag] = {
    "--variants": Flag("variants", "", type=list_of(str, "--variants")), "--steps": Flag("steps", "", type=int),
    "--seeds": Flag("seeds", "", type=int), "--seq-len": Flag("seq_len", "", type=int),
    "--batch-size": Flag("micro_batch", "", type=int), "--lr": Flag("lr", "", type=float),
    "--workers": Flag("workers", "", type=int), "--out": out_flag(), "--quiet": quiet_flag(),
}
