"""The mechanism study's settings: ``MechanismConfig`` (the recipe, the variants and
depths it trains, their checks) and its command-line flags."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gatedattn.data.backcopy import BigramBackcopy
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.settings import build, check_options, option
from gatedattn.models.lm import MLPS, SIZE_PRESETS, ModelConfig
from gatedattn.reproduce.registry import Flag, list_of, out_flag, quiet_flag

NAME = "mechanism"  # the study's name in the registry

STUDY_VARIANTS = ("baseline", "gated", "gated-headwise", "sink", "hyga", "hyga-lowrank", "hyga-sink", "hyga-h", "hyga-c")
GATED = ("gated", "gated-headwise", "hyga", "hyga-lowrank", "hyga-sink", "hyga-h", "hyga-c")
SINKS = ("sink", "hyga-sink")  # the variants with a learnable sink

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

    @classmethod
    def command(cls) -> str:
        """The command line that runs this study with its defaults."""
        return f"gatedattn reproduce --study {NAME}"

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



FLAGS: dict[str, Flag] = {
    "--variants": Flag("variants", "", type=list_of(str, "--variants")), "--steps": Flag("steps", "", type=int),
    "--seeds": Flag("seeds", "", type=int), "--seq-len": Flag("seq_len", "", type=int),
    "--batch-size": Flag("micro_batch", "", type=int), "--lr": Flag("lr", "", type=float),
    "--workers": Flag("workers", "", type=int), "--out": out_flag(), "--quiet": quiet_flag(),
}
