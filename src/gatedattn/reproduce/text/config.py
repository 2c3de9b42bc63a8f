"""The natural-text study's settings: ``TextConfig`` (its fields, their checks, and the
``TrainConfig`` of each run) and its command-line flags."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fields import field_types
from gatedattn.infra.precision import DTYPES
from gatedattn.infra.settings import build, check_options, dataclass_of, fields_dict, option
from gatedattn.layers.variants import VARIANTS
from gatedattn.models.lm import ModelConfig
from gatedattn.reproduce.registry import Flag, list_of, out_flag, quiet_flag
from gatedattn.train import TrainConfig
from gatedattn.train.config import COMPILE_MODES, ModelRecipe, has_gate

NAME = "text"  # the study's name in the registry


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


# steps of the schedule a timed step is taken from: warm-up done, the decay never reached
TIMING_STEPS = 1_000_000

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

    STUDY: ClassVar[str] = NAME  # its name in the study registry

    variants: tuple[str, ...] = option(("baseline", "gated"), help="attention presets to compare")
    seeds: int = option(3, gt=0, le=1000, help="seeds per variant; with 2+ the report tests seed noise")
    budget_minutes: float | None = option(20.0, gt=0, le=100_000, help="wall-clock budget: time each variant's training step "
                                                           "first and fit the steps to it (instead of steps)")
    steps: int | None = option(None, gt=0, le=10_000_000, help="fixed training steps per run (instead of budget_minutes)")
    out_dir: str = option("runs/reproduce-text", help="output directory")
    evals: int = option(8, gt=0, le=100_000, help="evaluations (with the sink metrics) per run")
    analysis_sequences: int = option(32, gt=0, le=1_000_000, help="validation sequences the final analysis reads")
    multiples: tuple[int, ...] = option((1, 2, 4, 8), ge=1, le=1024, help="extrapolation lengths as multiples of the context")
    timing_rounds: int = option(7, ge=3, le=1000, help="interleaved rounds of the step-time measurement after training "
                                              "(the overhead claim's noise estimate needs 3 or more)")
    min_steps: int = option(500, gt=0, le=10_000_000, help="fewest training steps a budget-fitted run may get: below it the "
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
            self.step_config(variant)

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
        return f"gatedattn reproduce --study {cls.STUDY}"

    @property
    def data_dir(self) -> str | None:
        return self.train.data_dir

    def model_recipe(self, variant: str) -> ModelRecipe:
        """The model settings of every run of ``variant``: ``train.model`` with that variant
        (the ``gate`` settings apply to the variants that have a gate)."""
        m = self.train.model
        return dataclasses.replace(m, variant=variant, gate=m.gate if has_gate(variant) else {})

    def model_config(self, variant: str, vocab_size: int) -> ModelConfig:
        """The ``ModelConfig`` every run of ``variant`` trains, on a vocabulary of ``vocab_size``."""
        return self.train.replace(model=self.model_recipe(variant)).model_config(vocab_size)

    def step_config(self, variant: str) -> TrainConfig:
        """The ``TrainConfig`` of one training step of ``variant`` as the study's runs take
        it, past warm-up and never decayed (what the step timings run)."""
        return self.train_config(variant, 0, steps=TIMING_STEPS)

    def train_config(self, variant: str, seed: int, *, steps: int, out_dir: str | None = None,
                     lr: float | None = None) -> TrainConfig:
        """The ``TrainConfig`` of one run: ``train`` with the run's own fields."""
        t = self.train
        return t.replace(
            out_dir=out_dir, model=self.model_recipe(variant), steps=steps, lr=lr or t.lr,
            warmup_steps=min(t.warmup_steps, max(steps // 10, 1)), seed=seed,
            eval_every=max(steps // self.evals, 1), ckpt_every=max(steps // 4, 1),
        )

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        data = dict(data)
        for f in dataclasses.fields(cls):  # the nested configs of the tree
            sub = dataclass_of(field_types(cls)[f.name])
            if sub is not None and isinstance(data.get(f.name), dict):
                data[f.name] = sub.from_dict(data[f.name])
        return build(cls, data)


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


# the flags of every study whose runs train on natural text with a TextConfig
FLAGS: dict[str, Flag] = {
    "--budget-minutes": Flag("budget_minutes", "wall-clock budget (default 20; the main job's text part 11): time "
                             "each variant's step here first and fit the steps to it", type=float, clears=("steps",)),
    "--steps": Flag("steps", "fixed training steps per run instead of a budget (--quick: 40)", type=int,
                    clears=("budget_minutes",)),
    "--seeds": Flag("seeds", "seeds per variant (default 3; --quick: 1); with 2+ the report tests seed noise",
                    type=int),
    "--data": Flag("train.data_dir", "prepared data directory (default: the bundled corpus, prepared once)",
                   only_flag=True),
    "--preset": Flag("train.model.size", "model size preset (default small)"),
    "--seq-len": Flag("train.seq_len", "training context (default 256)", type=int),
    "--batch-size": Flag("train.micro_batch", "sequences per step (default 16)", type=int),
    "--lr": Flag("train.lr", "peak learning rate (default 1e-2)", type=float),
    "--dtype": Flag("train.dtype", "auto (default): bf16 autocast where the device computes bf16 natively, else fp32",
                    choices=DTYPES),
    "--multiples": Flag("multiples", "extrapolation lengths as multiples of the context (default 1,2,4,8)",
                        type=list_of(int, "--multiples")),
    "--out": out_flag(),
    "--quiet": quiet_flag("train.progress"),
}
VARIANTS_FLAG = Flag("variants", "comma-separated presets (default baseline,gated)", type=list_of(str, "--variants"))
RUN_APART_FLAGS: dict[str, Flag] = {"--variants": VARIANTS_FLAG, **FLAGS}  # the text study and those run apart
