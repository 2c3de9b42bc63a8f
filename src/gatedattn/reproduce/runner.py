"""Train each variant on the same data, in the same order, for the same tokens; analyse
each; write ``results.json``, ``report.md`` and plots.

Layout of ``out``::

    out/results.json            every number the report shows
    out/report.md, out/*.png    the report
    out/runs/<variant>-s<seed>/ each training run (metrics.jsonl, checkpoints, final/)

A second call with the same ``out`` resumes: finished runs are reused, interrupted ones
continue from their last checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Mapping

import torch

from gatedattn.analysis.analyze import analyze, extrapolate
from gatedattn.analysis.metrics import seed_stat
from gatedattn.analysis.registry import TEXT_METRICS, keys
from gatedattn.layers.cost import cost
from gatedattn.data import TokenData, prepare
from gatedattn.infra.errors import ConfigError, Interrupted
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.models.lm import GatedLM
from gatedattn.infra.precision import resolve_dtype
from gatedattn.infra.provenance import run_meta, say
from gatedattn.reproduce.claims import judge_all
from gatedattn.reproduce.pretrained.claims import judge as judge_pretrained
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.pretrained.study import pretrained_part
from gatedattn.reproduce.mechanism import (
    MechanismConfig, build_results as mechanism_results, judge_depths, train_runs,
)
from gatedattn.reproduce.report import Section, write_report
from gatedattn.infra.timing import interleaved_times, median_times
from gatedattn.infra.settings import build, check_options, dataclass_of, option
from gatedattn.train import TrainConfig, train
from gatedattn.train.config import COMPILE_MODES, ModelRecipe, has_gate
from gatedattn.train.metrics import SpeedMeter, read_records
from gatedattn.train.trainer import Trainer
from gatedattn.layers.variants import VARIANTS

SUMMARY_METRICS = keys(TEXT_METRICS, "analysis")


def _base_train() -> TrainConfig:
    """The training settings of the default reproduction (see ``ReproduceConfig``): the
    `small` model without q/k RMSNorm at LR 1e-2, the recipe under which the sink
    calibration (docs/sink-calibration) saw the baseline's first-token sink form within the
    time one run of the default job gets on a 2-core CPU (with q/k norm, or at LR 1e-3, 3e-3
    or 3e-2, it did not). Its runs are eager unless the study's own ``compile`` decides
    otherwise (``choose_compile``)."""
    return TrainConfig(model=ModelRecipe(size="small", variant="gated", attention={"qk_norm": False}), seq_len=256,
                       micro_batch=16, lr=1e-2, warmup_steps=50, eval_batches=4, compile="off")


# TrainConfig fields that the reproduction sets for each run itself (the base recipe's
# variant only stands in for the gated ones, so that gate settings are checked at once)
_PER_RUN = ("out_dir", "steps", "max_tokens", "seed", "eval_every", "ckpt_every", "stop_at_step", "model.variant",
            "compile",  # the study's own ``compile`` decides it
            "init_from", "trainable")  # its runs train from scratch, every parameter
# the names ``TextConfig.make`` routes into ``train``
_TRAIN_NAMES = frozenset({f.name for f in dataclasses.fields(TrainConfig)} | {"variant", "preset", "model_overrides"})


@dataclass(frozen=True)
class TextConfig:
    """The natural-text study: every variant trains ``steps`` steps with the settings of
    ``train`` (a base ``TrainConfig``; each run sets its variant, seed, steps, output
    directory and evaluation and checkpoint intervals), then is analysed on held-out text.
    With ``budget_minutes`` instead, the step count is derived from timing the trainer's
    own step of each variant on this machine first (the same count for every variant, on
    the same batches in the same order, so every variant sees the same tokens); about 80 %
    of the budget goes to training, the rest to evaluation and analysis. ``budget_minutes``
    is the default, so the study takes about the same wall time on a fast and on a slow
    CPU; a slower machine trains fewer tokens, and the report says how many.

    The default runs ``baseline`` and ``gated`` with 3 seeds each, so that every claim is
    judged against seed noise; the recipe (no q/k norm, LR 1e-2) is the one the sink
    calibration found to grow the baseline's first-token sink fastest at this budget.

    :meth:`make` takes fields of ``TrainConfig`` by name as well (``make(lr=1e-2,
    preset="tiny")`` changes ``train``). The learning-rate and rank studies and the main
    job extend this config with their own fields."""

    STUDY: ClassVar[str] = "text"  # its name in the study registry

    variants: tuple[str, ...] = option(("baseline", "gated"), help="attention presets to compare")
    seeds: int = option(3, gt=0, help="seeds per variant; with 2+ the report tests seed noise")
    budget_minutes: float | None = option(20.0, gt=0, help="wall-clock budget: time each variant's training step "
                                                           "first and fit the steps to it (instead of steps)")
    steps: int | None = option(None, gt=0, help="fixed training steps per run (instead of budget_minutes)")
    out_dir: str = option("runs/reproduce-text", help="output directory")
    evals: int = option(8, gt=0, help="evaluations (with the sink metrics) per run")
    analysis_sequences: int = option(32, gt=0, help="validation sequences the final analysis reads")
    multiples: tuple[int, ...] = option((1, 2, 4, 8), ge=1, help="extrapolation lengths as multiples of the context")
    timing_rounds: int = option(7, ge=3, help="interleaved rounds of the step-time measurement after training "
                                              "(the overhead claim's noise estimate needs 3 or more)")
    min_steps: int = option(500, gt=0, help="fewest training steps a budget-fitted run may get: below it the "
                                            "study steps down to a smaller preset, then to fewer seeds")
    compile: str = option("auto", choices=COMPILE_MODES, help="torch.compile every run: auto (with a budget, time "
                          "each variant's compiled step here too, its compile time included, and compile where that "
                          "fits more steps into the budget; with fixed steps, off), on or off")
    train: TrainConfig = field(default_factory=_base_train, metadata={
        "help": "the base training settings of every run", "exclude": _PER_RUN})

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not isinstance(self.train, TrainConfig):
            raise ConfigError(f"{owner}.train must be a TrainConfig, got {type(self.train).__name__}")
        for f in dataclasses.fields(self):  # lists (from JSON or a caller) become the declared tuples
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        check_options(self)
        self._check_variants(owner)
        if (self.steps is None) == (self.budget_minutes is None):
            raise ConfigError(f"{owner}: give exactly one of steps and budget_minutes "
                              f"(got steps={self.steps}, budget_minutes={self.budget_minutes})")
        if self.train.model.lm.get("position_embedding") == "learned" and max(self.multiples, default=1) > 1:
            raise ConfigError(f"{owner}.multiples={self.multiples}: a model with position_embedding='learned' cannot "
                              "be read beyond its training context; set multiples=1")
        for variant in self.variants:  # fail now, not after an hour: each run's config is valid
            self.train_config(variant, 0, steps=10)

    def _check_variants(self, owner: str) -> None:
        if not self.variants:
            raise ConfigError(f"{owner}.variants is empty; name at least one of: {', '.join(VARIANTS)}")
        for v in self.variants:
            if v not in VARIANTS:
                raise ConfigError(f"{owner}.variants: unknown variant {v!r}; known variants: {', '.join(VARIANTS)}")
        if len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"{owner}.variants names a variant twice: {', '.join(self.variants)}")

    @classmethod
    def make(cls, **fields: Any) -> Any:
        """The config with ``fields``, where a ``TrainConfig`` field (or ``preset``,
        ``variant``, ``model_overrides``) given by name changes ``train``, and ``steps``
        given without ``budget_minutes`` replaces the budget (and the other way round)."""
        fields = _route_train_fields(cls, fields)
        for given, other in (("steps", "budget_minutes"), ("budget_minutes", "steps")):
            if fields.get(given) is not None and other not in fields:
                fields[other] = None
        return cls(**fields)

    @classmethod
    def quick(cls, **changes: Any) -> Any:
        """About a minute on a 2-core CPU: a smoke test of the whole pipeline."""
        out_dir = cls.__dataclass_fields__["out_dir"].default + "-quick"
        base = dict(preset="tiny", seq_len=128, micro_batch=8, steps=40, budget_minutes=None, warmup_steps=5, evals=2,
                    seeds=1, analysis_sequences=8, multiples=(1, 2), out_dir=out_dir, min_steps=10, timing_rounds=3,
                    **cls._quick_fields())
        return cls.make(**{**base, **changes})

    @classmethod
    def _quick_fields(cls) -> dict[str, Any]:
        """The quick run's values of a subclass's own fields."""
        return {}

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    @classmethod
    def command(cls) -> str:
        """The command line that runs this study with its defaults."""
        return "gatedattn reproduce" + ("" if cls.STUDY == "main" else f" --study {cls.STUDY}")

    @property
    def data_dir(self) -> str | None:
        return self.train.data_dir

    def train_config(self, variant: str, seed: int, *, steps: int, out_dir: str | None = None,
                     lr: float | None = None) -> TrainConfig:
        """The ``TrainConfig`` of one run: ``train`` with the run's own fields. The ``gate``
        settings apply to the variants that have a gate."""
        t = self.train
        model = dataclasses.replace(t.model, variant=variant, gate=t.model.gate if has_gate(variant) else {})
        return t.replace(
            out_dir=out_dir, model=model, steps=steps, lr=lr or t.lr,
            warmup_steps=min(t.warmup_steps, max(steps // 10, 1)), seed=seed,
            eval_every=max(steps // self.evals, 1), ckpt_every=max(steps // 4, 1),
        )

    def to_dict(self) -> dict[str, Any]:
        d = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            d[f.name] = (value.to_dict() if hasattr(value, "to_dict") else
                         list(value) if isinstance(value, tuple) else value)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        data = dict(data)
        for f in dataclasses.fields(cls):  # the nested configs of the tree
            sub = dataclass_of(typing.get_type_hints(cls)[f.name])
            if sub is not None and isinstance(data.get(f.name), dict):
                data[f.name] = sub.from_dict(data[f.name])
        return build(cls, data)


@dataclass(frozen=True)
class ReproduceConfig(TextConfig):
    """The main job: the Bigram-Backcopy mechanism study (``mechanism``), then the
    natural-text study (the fields of :class:`TextConfig`); ``fold`` joins the results of
    learning-rate and rank studies run apart to its claims."""

    STUDY: ClassVar[str] = "main"

    out_dir: str = option("runs/reproduce", help="output directory")
    fold: tuple[str, ...] = option((), help="output directories of an lr or rank study whose results join this "
                                            "report's claims table")
    budget_minutes: float | None = option(15.0, gt=0, help="wall-clock budget of the natural-text part: time each "
                                                           "variant's training step first and fit the steps to it "
                                                           "(instead of steps)")
    mechanism: MechanismConfig | None = field(default_factory=MechanismConfig, metadata={
        "help": "the Bigram-Backcopy mechanism study that opens the main job (None: left out)",
        "exclude": ("out_dir", "progress")})
    pretrained: PretrainedConfig | None = field(default_factory=PretrainedConfig, metadata={
        "help": "the real-model study, the main job's second part (None: left out)",
        "exclude": ("out_dir", "progress")})

    def __post_init__(self) -> None:
        for name, kind in (("mechanism", MechanismConfig), ("pretrained", PretrainedConfig)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"ReproduceConfig.{name} must be a {kind.__name__} or None, "
                                  f"got {type(value).__name__}")
        super().__post_init__()

    @classmethod
    def _quick_fields(cls) -> dict[str, Any]:
        return {"mechanism": MechanismConfig.quick(), "pretrained": PretrainedConfig.quick()}


def _route_train_fields(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with those that are not ``cls``'s own moved into its ``train`` (a field
    of neither is refused by name)."""
    own = {f.name for f in dataclasses.fields(cls)}
    moved = {k: v for k, v in fields.items() if k not in own}
    unknown = sorted(set(moved) - _TRAIN_NAMES)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field {unknown[0]!r}; fields are: {', '.join(sorted(own))} "
                          "and those of TrainConfig")
    routed = {k: v for k, v in fields.items() if k in own}
    if moved:
        routed["train"] = (routed.get("train") or _base_train()).replace(**moved)
    return routed


# ------------------------------------------------------------------------------ helpers
def default_data_dir() -> Path:
    """Where the default corpus is prepared once and reused."""
    root = os.environ.get("GATEDATTN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gatedattn")
    return Path(root) / "default-data-v1"


def ensure_data(cfg: TextConfig) -> Path:
    if cfg.data_dir:
        return Path(cfg.data_dir)
    path = default_data_dir()
    if not (path / "manifest.json").is_file():
        _say(f"preparing the default corpus into {path} (once)")
        prepare(None, path, default_corpus=True, progress=cfg.train.progress)
    return path


def _say(msg: str) -> None:
    say("reproduce", msg)


def make_step(cfg: TextConfig, variant: str, data: TokenData) -> Callable[[], None]:
    """One call of the trainer's own ``train_step`` for ``variant``, as a function (for timing)."""
    trainer = Trainer(cfg.train_config(variant, 0, steps=1_000_000), data)
    return lambda: trainer.train_step()


def time_steps(cfg: TextConfig, data: TokenData, repeats: int = 5) -> dict[str, float]:
    """Seconds per training step of every variant here: medians of ``repeats`` interleaved
    rounds (odd rounds in reverse order, two untimed rounds first), so that a burst of
    load on the machine moves every variant's time alike and the median drops it."""
    return median_times({v: make_step(cfg, v, data) for v in cfg.variants}, repeats=repeats, warmup=2)


def plan_steps(cfg: TextConfig, data: TokenData, n_runs_per_variant: int,
               counts: dict[str, int] | None = None) -> tuple[int, dict[str, float]]:
    """Training steps that fit the budget: 80 % of it for training, the rest for evaluation
    and analysis; every variant gets the same number of steps (the same tokens).
    ``counts``: runs of each variant per seed where not one each."""
    if cfg.budget_minutes is None:
        return cfg.steps, {}
    step_s = time_steps(cfg, data)
    steps = _fit(cfg, {v: s * (counts or {}).get(v, 1) for v, s in step_s.items()}, n_runs_per_variant)
    eta = time.strftime("%H:%M", time.localtime(time.time() + cfg.budget_minutes * 60))
    _say(f"timed steps {', '.join(f'{v} {s:.2f}s' for v, s in step_s.items())}: {steps} steps per run "
         f"({steps * cfg.train.micro_batch * cfg.train.seq_len / 1e6:.2f} M tokens, the same for every variant) fit "
         f"{cfg.budget_minutes:g} min; ETA {eta}")
    return steps, step_s


STEP_DOWN_PRESETS = ("small", "tiny")  # smaller models to try, in order, when a budget fits too few steps


def fit_plan(cfg: TextConfig, data: TokenData) -> tuple[TextConfig, int, dict[str, float], list[str], dict[str, Any]]:
    """The study's plan (:func:`fit_eager_plan`), then whether its runs compile
    (:func:`choose_compile`): the config that runs, its steps, the seconds per step, what was
    cut and the compile decision."""
    cfg, steps, step_s, cuts = fit_eager_plan(cfg, data)
    cfg, steps, step_s, decision = choose_compile(cfg, data, steps, step_s)
    return cfg, steps, step_s, cuts, decision


def choose_compile(cfg: TextConfig, data: TokenData, steps: int,
                   step_s: dict[str, float]) -> tuple[TextConfig, int, dict[str, float], dict[str, Any]]:
    """``compile`` resolved: on and off as asked; auto with a budget times each variant's
    compiled and eager steps here in the same rounds (:func:`time_compiled`; the first
    compiled step's extra seconds are its compile time, paid once per run) and compiles where
    that fits more steps into the budget than eager steps would; auto
    with fixed steps stays eager. The config with ``train.compile`` set, its steps and
    seconds per step, and the decision with its figures (for the report)."""
    if cfg.compile != "auto" or cfg.budget_minutes is None:
        mode = "on" if cfg.compile == "on" else "off"
        return _compiled(cfg, mode), steps, step_s, {"mode": cfg.compile, "compile": mode == "on"}
    timed = time_compiled(cfg, data)
    compiled_s = {v: compiled for v, (_, compiled, _) in timed.items()}
    eager_s = {v: eager for v, (_, _, eager) in timed.items()}  # timed in the same rounds as compiled_s
    overhead = sum(first for first, _, _ in timed.values()) * cfg.seeds  # one compile per run
    budget_s = cfg.budget_minutes * 60 * 0.8 - overhead
    compiled_steps = _round_steps(budget_s / (sum(compiled_s.values()) * cfg.seeds)) if budget_s > 0 else 0
    eager_steps = _fit(cfg, eager_s, cfg.seeds)  # what fits the budget, before the min_steps floor
    chosen = compiled_steps > eager_steps
    decision = {"mode": "auto", "compile": chosen, "eager_steps": eager_steps, "compiled_steps": compiled_steps,
                "eager_step_s": eager_s, "compiled_step_s": compiled_s,
                "compile_s": {v: first for v, (first, _, _) in timed.items()}}
    _say_compile(decision)
    if not chosen:
        return _compiled(cfg, "off"), steps, step_s, decision
    return _compiled(cfg, "on"), max(compiled_steps, cfg.min_steps), compiled_s, decision


def _say_compile(d: dict[str, Any]) -> None:
    steps = ", ".join(f"{v} {t:.2f}s" for v, t in d["compiled_step_s"].items())
    compiling = ", ".join(f"{v} {t:.0f}s" for v, t in d["compile_s"].items())
    _say(f"compiled steps {steps} after {compiling} of compiling: {d['compiled_steps']} steps fit, eager "
         f"{d['eager_steps']}: {'compiling' if d['compile'] else 'eager'}")


def _compiled(cfg: TextConfig, mode: str) -> TextConfig:
    return dataclasses.replace(cfg, train=cfg.train.replace(compile=mode))


def time_compiled(cfg: TextConfig, data: TokenData, repeats: int = 3) -> dict[str, tuple[float, float, float]]:
    """Per variant: (compile seconds: a fresh compiled trainer's first step beyond a compiled
    step; median compiled step; median eager step), the compiled and eager steps of every
    variant timed together in interleaved rounds (:func:`median_times`), so that load on
    the machine falls on both modes alike."""
    torch._dynamo.reset()
    first, steps = {}, {}
    for variant in cfg.variants:
        trainer = Trainer(cfg.train_config(variant, 0, steps=1_000_000).replace(compile="on"), data)
        started = time.perf_counter()
        trainer.train_step()
        first[variant] = time.perf_counter() - started
        steps[f"compiled {variant}"] = trainer.train_step
        steps[f"eager {variant}"] = make_step(cfg, variant, data)
    times = median_times(steps, repeats=repeats, warmup=1)
    return {v: (max(first[v] - times[f"compiled {v}"], 0.0), times[f"compiled {v}"], times[f"eager {v}"])
            for v in cfg.variants}


def fit_eager_plan(cfg: TextConfig, data: TokenData) -> tuple[TextConfig, int, dict[str, float], list[str]]:
    """The main job's plan: steps fitted to the budget, never fewer than ``min_steps``.
    Where the configured model and seeds do not fit that floor, step down: a smaller
    preset first (``STEP_DOWN_PRESETS``), then fewer seeds. Returns the config that runs,
    its steps, the timed seconds per step and what was cut (sentences for the report)."""
    steps, step_s = plan_steps(cfg, data, cfg.seeds)
    if cfg.budget_minutes is None or steps >= cfg.min_steps:
        return cfg, steps, step_s, []
    cuts = [f"`{cfg.train.model.size}` × {cfg.seeds} seeds fits {steps} steps per run into {cfg.budget_minutes:g} min "
            f"here, under the floor of {cfg.min_steps}"]
    preset_now = cfg.train.model.size
    smaller = STEP_DOWN_PRESETS[STEP_DOWN_PRESETS.index(preset_now) + 1:] if preset_now in STEP_DOWN_PRESETS else ()
    for preset in smaller:
        trial = dataclasses.replace(cfg, train=cfg.train.replace(model=dataclasses.replace(cfg.train.model, size=preset)))
        steps, step_s = plan_steps(trial, data, cfg.seeds)
        if steps >= cfg.min_steps:
            cuts.append(f"so the model steps down to `{preset}` ({steps} steps, {cfg.seeds} seeds)")
            return trial, steps, step_s, cuts
        cfg = trial
        cuts.append(f"`{preset}` fits {steps}")
    seeds = next((n for n in range(cfg.seeds - 1, 1, -1) if _fit(cfg, step_s, n) >= cfg.min_steps), 1)
    if seeds < cfg.seeds:
        steps = _fit(cfg, step_s, seeds)
        cuts.append(f"so the seeds step down to {seeds} at `{cfg.train.model.size}` ({steps} steps)")
    return dataclasses.replace(cfg, seeds=seeds), max(steps, cfg.min_steps), step_s, cuts


def _fit(cfg: TextConfig, step_s: dict[str, float], runs_per_variant: int) -> int:
    """Steps per run that fit 80 % of the budget (the rest: evaluation and analysis)."""
    per_step = sum(step_s.values()) * runs_per_variant
    return _round_steps(cfg.budget_minutes * 60 * 0.8 / per_step)


def _round_steps(steps: float) -> int:
    """A step count rounded down to tens, at least 10."""
    steps = int(steps + 1e-9)
    return max(10, steps - steps % 10)


class SinkTracker:
    """Eval hook: F-Attn (mean over layers, and ``f_attn_max`` of the strongest layer),
    Sink^eps and M-Act on a few validation sequences during training."""

    def __init__(self, data: TokenData, seq_len: int, sequences: int = 4):
        self.batch = next(data.val_batches(seq_len=seq_len, batch_size=sequences, max_batches=1))

    def __call__(self, model: torch.nn.Module, step: int, tokens: int) -> dict[str, float]:
        model = getattr(model, "module", model)
        r = analyze(model, [self.batch.to(next(model.parameters()).device)], layers_for_maps=[])
        out = {"f_attn": r["f_attn"], "f_attn_max": max(r["f_attn_per_layer"]), "sink_eps": r["sink_eps"],
               "m_act": r["m_act"]}
        if r.get("gate_mean") is not None:
            out["gate_mean"] = r["gate_mean"]
        return {k: float(v) for k, v in out.items() if v is not None}


# ------------------------------------------------------------------------------ one run
def run_one(cfg: TextConfig, data_dir: Path, data: TokenData, variant: str, seed: int, steps: int,
            out: Path, *, lr: float | None = None, analyse: bool = True, tag: str | None = None) -> dict[str, Any]:
    tag = tag or f"{variant}-s{seed}" + (f"-lr{lr:g}" if lr is not None else "")
    run_dir = out / "runs" / tag
    tcfg = cfg.train_config(variant, seed, steps=steps, out_dir=str(run_dir), lr=lr).replace(data_dir=str(data_dir))
    _say(f"training {tag}: {steps} steps of {tcfg.micro_batch}x{tcfg.seq_len} tokens")
    hook = SinkTracker(data, tcfg.seq_len) if analyse else None
    result = train(tcfg, eval_hook=hook, resume=True)
    if result.interrupted is not None:  # a signal stops the whole study, not just this run
        raise Interrupted(f"{result.interrupted}: {tag} stopped after step {result.steps} with a checkpoint; the same "
                          "command continues it", 128 + result.interrupted_signal)
    run: dict[str, Any] = {
        "variant": variant, "seed": seed, "lr": tcfg.lr, "run_dir": str(run_dir.relative_to(out)),
        "steps": result.steps, "tokens": result.tokens, "diverged": result.diverged,
        "diverged_reason": result.diverged_reason, "spikes": result.spikes,
        "final_loss": result.final_loss, "tokens_per_s": result.tokens_per_s, "train_seconds": result.elapsed_s,
        **_curves(read_records(run_dir)),
    }
    if not analyse or result.final_dir is None:
        return run
    return {**run, **analyse_run(cfg, data, run_dir, result.final_dir, result.steps, tcfg.seq_len, tag)}


def analyse_run(cfg: TextConfig, data: TokenData, run_dir: Path, final_dir: str, steps: int, seq_len: int,
                tag: str) -> dict[str, Any]:
    """The analysis (and extrapolation) of a finished run; kept in ``analysis.json`` so that
    a later call with the same analysis settings reuses it."""
    cache = run_dir / "analysis.json"
    key = {"steps": steps, "analysis_sequences": cfg.analysis_sequences, "multiples": list(cfg.multiples),
           "seq_len": seq_len}
    if cache.is_file():
        saved = read_json_object(cache)
        if saved.get("key") == key:
            _say(f"reusing the analysis of {tag}")
            return saved["run"]
    model = GatedLM.from_pretrained(final_dir)
    batches = data.val_batches(seq_len=seq_len, batch_size=8, max_batches=math.ceil(cfg.analysis_sequences / 8))
    _say(f"analysing {tag}")
    found = {"analysis": analyze(model, batches, layers_for_maps=[model.cfg.n_layers // 2])}
    if cfg.multiples:
        found["extrapolation"] = extrapolate(model, data, train_len=seq_len, multiples=cfg.multiples, batch_size=4)
    atomic_write_json(cache, json_safe({"key": key, "run": found}))
    return found


TRACKED = ("f_attn", "f_attn_max", "sink_eps", "m_act", "gate_mean")  # the SinkTracker's figures over training


def _series(records: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, list]:
    """Each key's values over ``records``, skipping records without it."""
    return {k: [r[k] for r in records if k in r] for k in keys}


def _curves(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Training and validation curves and the sink metrics over training, from metrics.jsonl."""
    train_recs = [r for r in records if r.get("kind") == "train"]
    eval_recs = [r for r in records if r.get("kind") == "eval"]
    tracked = [r for r in eval_recs if "f_attn" in r]
    return {
        "curve": {"steps": [r["step"] for r in train_recs], **_series(train_recs, ("tokens", "loss"))},
        "val_curve": {"steps": [r["step"] for r in eval_recs], **_series(eval_recs, ("tokens", "val_loss"))},
        "over_training": {"tokens": [r["tokens"] for r in tracked], **_series(eval_recs, TRACKED)},
    }


def _extrapolation_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scaling method the loss at the longest length each seed reached, and that
    length as a multiple of the context (nothing unless every seed measured it)."""
    ext = [r.get("extrapolation") for r in runs]
    if not all(ext):
        return {}
    out: dict[str, Any] = {}
    for method in ext[0]["methods"]:
        longest = [next((x for x in reversed(e["methods"][method]) if x is not None), None) for e in ext]
        out[f"ext_{method}_longest"] = seed_stat(longest)
    first = ext[0]["methods"][next(iter(ext[0]["methods"]))]
    done = [L for L, x in zip(ext[0]["lengths"], first) if x is not None]
    out["ext_longest_multiple"] = done[-1] / ext[0]["train_len"] if done else None
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, std and per-seed values of every headline metric of one variant."""
    summary: dict[str, Any] = {key: seed_stat([r.get("analysis", {}).get(key) for r in runs]) for key in SUMMARY_METRICS}
    summary["tokens_per_s"] = seed_stat([r["tokens_per_s"] for r in runs])
    summary["final_train_loss"] = seed_stat([r["final_loss"] for r in runs])
    return {**summary, **_extrapolation_summary(runs)}


def add_strongest_layer(results: dict[str, Any]) -> None:
    """The layer where the baseline's sink is strongest (largest seed-mean F-Attn) as
    ``results["strongest_layer"]``, and every variant's F-Attn at that layer as the summary
    metric ``f_attn_strongest``; without a baseline, nothing."""
    base = results["variants"].get("baseline")
    if not base:
        return
    per_layer = [r["analysis"]["f_attn_per_layer"] for r in base["runs"] if r.get("analysis")]
    if not per_layer:
        return
    means = [statistics.fmean(col) for col in zip(*per_layer)]
    layer = max(range(len(means)), key=means.__getitem__)
    results["strongest_layer"] = layer
    for variant, entry in results["variants"].items():
        values = [r["analysis"]["f_attn_per_layer"][layer] for r in entry["runs"] if r.get("analysis")]
        if values:
            results["summary"][variant]["f_attn_strongest"] = seed_stat(values)


# ------------------------------------------------------------------------------ entry points
def reproduce(cfg: TextConfig, command: str | None = None, *, parts: Sequence[MainPart] = (),
              fold: tuple[str, ...] = (), foldable: Mapping[str, Section] = MappingProxyType({})) -> Path:
    """The natural-text study of ``cfg``, after the main job's other ``parts`` (each run
    into ``out``, its results under its key), with the studies written in the
    directories ``fold`` joined to its claims; writes ``results.json`` and ``report.md``;
    returns the report's path. ``foldable``: the results key of each study that may be
    folded in, with its report section (from the study registry)."""
    started = time.time()
    folds = read_folds(fold, tuple(foldable))
    out, data_dir, data, results = _start(cfg)
    for part in parts:
        part_started = time.time()
        _say(f"{part.key}: starting")
        results[part.key] = part.run(out)
        results[part.key].setdefault("minutes", (time.time() - part_started) / 60)
        _say(f"{part.key} done in {results[part.key]['minutes']:.1f} min")
        atomic_write_json(out / "results.json", json_safe(results))
    cfg, steps, step_s, cuts = text_part(cfg, data_dir, data, out, results)
    add_strongest_layer(results)
    fold_in(results, folds, tuple(foldable))
    results["gate_cost"] = gate_costs(cfg, data, [*cfg.variants, "gated", "hyga-lowrank"])
    _say("timing training steps of each variant in interleaved rounds")
    samples = interleaved_times({v: make_step(cfg, v, data) for v in cfg.variants}, repeats=cfg.timing_rounds,
                                warmup=2, per_sample=3)
    results["step_time_samples"] = samples
    results["step_time"] = {v: statistics.median(s) for v, s in samples.items()}
    results["step_mfu"] = {v: _step_speed(cfg.train_config(v, 0, steps=1_000_000), data, t)
                           for v, t in results["step_time"].items()}
    results["config"].update(steps=steps, batch_tokens=cfg.train.micro_batch * cfg.train.seq_len,
                             seeds=list(range(cfg.seeds)), step_seconds=step_s, cuts=cuts)
    results["meta"] = _meta(cfg, data, command, started)
    results["claims"] = judge_all(results)
    atomic_write_json(out / "results.json", json_safe(results))
    return write_report(results, out, sections=list(foldable.values()),
                        parts=[(p.key, p.section) for p in parts])


def run_apart(cfg: TextConfig, command: str | None, key: str, study: Callable[..., dict[str, Any]],
              report: Callable[[dict[str, Any], Path], Path]) -> Path:
    """A study run on its own (the lr and rank studies): ``study(cfg, data_dir, data,
    out)`` trains into ``results[key]``; writes ``results.json`` and, with ``report``,
    ``report.md``; returns the report's path."""
    started = time.time()
    out, data_dir, data, results = _start(cfg)
    results[key] = study(cfg, data_dir, data, out)
    results["config"].update(steps=results[key]["steps"], batch_tokens=cfg.train.micro_batch * cfg.train.seq_len,
                             seeds=list(range(cfg.seeds)))
    results["meta"] = _meta(cfg, data, command, started)
    atomic_write_json(out / "results.json", json_safe(results))
    return report(results, out)


def _step_speed(train_cfg: TrainConfig, data: TokenData, step_s: float) -> dict[str, Any]:
    """Model FLOP/s and MFU of one training step of ``train_cfg`` that took ``step_s``."""
    tokens_per_s = train_cfg.tokens_per_step(1) / step_s if step_s > 0 else 0.0
    return SpeedMeter.for_config(train_cfg, data).fields(tokens_per_s)


def _start(cfg: TextConfig) -> tuple[Path, Path, TokenData, dict[str, Any]]:
    """A study's output directory, its data (prepared once where none is given, and
    checked before the output directory exists), and its results as they start."""
    data_dir = ensure_data(cfg)
    data = TokenData(data_dir, verify=True)
    data.check_tokenizer()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {"study": cfg.STUDY, "config": {**cfg.to_dict(), **_report_fields(cfg.train)},
               "variants": {}, "summary": {}}
    return out, data_dir, data, results


def text_part(cfg: TextConfig, data_dir: Path, data: TokenData, out: Path,
              results: dict[str, Any]) -> tuple[TextConfig, int, dict[str, float], list[str]]:
    """The natural-text study's training: plan the steps (``fit_plan``), train and analyse
    every variant and seed into ``results``; the config that ran, its steps, the timed
    step seconds and what the plan cut."""
    started = time.time()
    cfg, steps, step_s, cuts, decision = fit_plan(cfg, data)
    results["config"] = {**cfg.to_dict(), **_report_fields(cfg.train), "compile_choice": decision}
    for variant in cfg.variants:
        runs = [run_one(cfg, data_dir, data, variant, seed, steps, out) for seed in range(cfg.seeds)]
        results["variants"][variant] = {"runs": runs}
        results["summary"][variant] = summarize(runs)
        atomic_write_json(out / "results.json", json_safe(results))  # progress survives a crash
    results["text_minutes"] = (time.time() - started) / 60
    return cfg, steps, step_s, cuts


def _meta(cfg: TextConfig, data: TokenData, command: str | None, started: float) -> dict[str, Any]:
    """The provenance of a study, with its data, model and precision in words."""
    mcfg = cfg.train_config("baseline", 0, steps=10).model_config(data.vocab_size)
    a = mcfg.attention
    n_params = sum(p.numel() for p in GatedLM(mcfg).parameters())
    return {
        **run_meta(command or cfg.command(), started),
        "data": f"{data.manifest.source} — {data.train_tokens:,} training / {data.val_tokens:,} validation tokens, "
                f"vocab {data.vocab_size} (byte-level BPE)",
        "model": f"{mcfg.n_layers} layers, d_model {a.d_model}, {a.n_heads} heads ({a.n_kv_heads} KV), "
                 f"SwiGLU {mcfg.ffn_dim}, {n_params / 1e6:.2f} M parameters (baseline)",
        "analysis_tokens": cfg.analysis_sequences * cfg.train.seq_len,
        "precision": resolve_dtype(cfg.train.dtype, "cpu").as_dict(),
    }


def rejudge(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with every claim judged anew by the current rules: the mechanism
    study's at each depth, the natural-text study's (for ``--report-only``)."""
    if results.get("mechanism"):
        judge_depths(results["mechanism"])
    if results.get("pretrained"):
        results["pretrained"]["claims"] = judge_pretrained(results["pretrained"])
    if results.get("variants"):
        results["claims"] = judge_all(results)
    return results


@dataclass(frozen=True)
class MainPart:
    """A part of the main job before natural text: its results key, ``run(out) -> results``
    and its report writer."""

    key: str
    run: Callable[[Path], dict[str, Any]]
    section: Callable[[dict, Path, str], list[str]]


def run_mechanism_part(mcfg: MechanismConfig, out: Path) -> dict[str, Any]:
    """The mechanism study as a part of the main job, in ``out/mechanism`` (its runs are
    reused by a second call); its results, with the wall time it took."""
    started = time.time()
    mcfg = mcfg.replace(out_dir=str(out / "mechanism"), progress=True)
    _say(f"the mechanism study ({len(mcfg.plan())} runs of {mcfg.steps} steps, {mcfg.workers} at a time)")
    records = train_runs(mcfg, Path(mcfg.out_dir))
    results = mechanism_results(mcfg, mcfg.task(), records)
    results["minutes"] = (time.time() - started) / 60
    return results


def run_pretrained_part(pcfg: PretrainedConfig, out: Path) -> dict[str, Any]:
    """The real-model study as a part of the main job, in ``out/pretrained`` (finished
    stages are reused by a second call); its results, judged."""
    results = pretrained_part(pcfg.replace(out_dir=str(out / "pretrained")), out / "pretrained")
    results["claims"] = judge_pretrained(results)
    return results


def read_folds(dirs: tuple[str, ...], keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The results of each study directory to fold in (one that holds results under one
    of ``keys``), read and checked before anything trains."""
    folds = []
    for d in dirs:
        if not (Path(d) / "results.json").is_file():
            raise ConfigError(f"ReproduceConfig.fold: {d} has no results.json (give the --out of an lr or rank study)")
        other = read_json_object(Path(d) / "results.json")
        if not any(other.get(k) for k in keys):
            raise ConfigError(f"ReproduceConfig.fold: {d}/results.json holds no {' or '.join(keys)}")
        folds.append((d, other))
    return folds


def fold_in(results: dict[str, Any], folds: list[tuple[str, dict[str, Any]]], keys: tuple[str, ...]) -> None:
    """Join the results (under ``keys``) of each folded study to ``results`` (the claims
    table then judges them too); ``results["folded"]`` records each one's command."""
    for d, other in folds:
        found = [k for k in keys if other.get(k)]
        for key in found:
            results[key] = other[key]
        results.setdefault("folded", []).append(
            {"dir": str(d), "studies": found, "command": (other.get("meta") or {}).get("command"),
             "machine": (other.get("meta") or {}).get("machine")})


def _report_fields(t: TrainConfig) -> dict[str, Any]:
    """The training settings the report quotes, by their report names."""
    return {"preset": t.model.size, "seq_len": t.seq_len, "micro_batch": t.micro_batch, "lr": t.lr,
            "warmup_steps": t.warmup_steps, "dtype": t.dtype, "optimizer": t.optimizer, "data_dir": t.data_dir,
            "schedule": t.schedule}


def gate_costs(cfg: TextConfig, data: TokenData, variants: list[str]) -> dict[str, dict[str, int]]:
    """Per attention layer of this run's model: parameters and FLOPs, total and of the gate."""
    costs = {}
    for v in dict.fromkeys(variants):
        attention = cfg.train_config(v, 0, steps=10).model_config(data.vocab_size).attention
        c = cost(attention, cfg.train.seq_len)
        costs[v] = {"gate_params": c.params["gate"], "gate_flops": c.flops["gate"],
                    "params": c.total_params, "flops": c.total_flops}
    return costs


def describe_recipe(t: TrainConfig, vocab_size: int) -> str:
    """The settings a study's runs share, in words (for reports of studies run apart)."""
    m = t.model_config(vocab_size)
    a = m.attention
    return (f"{m.n_layers} layers, d_model {m.d_model}, {a.n_heads} heads, q/k norm {'on' if a.qk_norm else 'off'}, "
            f"T {t.seq_len}, {t.micro_batch * t.grad_accum} sequences a step, {t.steps} steps, warm-up "
            f"{t.warmup_steps}, {t.schedule} decay, weight decay {t.weight_decay:g}, "
            f"gradient clipping {t.grad_clip:g}, {t.optimizer}")
