"""``TrainConfig``: everything one training run needs, validated on construction.

The config is a tree: ``TrainConfig`` holds the run's settings and a ``ModelRecipe``
(``model``): a size preset, an attention variant and overrides of the model, attention,
gate and RoPE fields, which builds the ``ModelConfig`` once the data gives the vocabulary.
Every field is documented once, where it is declared (``option(help=...)``); the
command line's ``--set`` keys and their help are generated from this tree
(:mod:`gatedattn.infra.settings`).

The global batch is ``micro_batch * grad_accum * world_size`` rows of ``seq_len`` tokens
(plus the BOS column the data adds); ``world_size`` is the number of data-parallel
processes (1 without ``torchrun``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch

from gatedattn.layers.config import AttentionConfig, GateConfig, RopeConfig
from gatedattn.infra.errors import ConfigError, check_choice, check_types
from gatedattn.models.lm import SIZE_PRESETS, ModelConfig
from gatedattn.infra.precision import DTYPES
from gatedattn.infra.settings import (apply_sets, build, check_options, option, parse_sets as parse_paths, parse_value,
                                      resolve, settings)
from gatedattn.layers.variants import VARIANTS

# ``TrainConfig.trainable``'s named groups (anything else is an fnmatch pattern over parameter
# names); what each selects is ``gatedattn.train.optim.matches``
TRAINABLE_GROUPS = {"gates": "every gate parameter (names containing .gate.)",
                    "sink": "the learnable attention-sink logits (names ending in .sink)",
                    "all": "every parameter"}

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "linear", "constant")
DEVICES = ("auto", "cpu", "cuda")
COMPILE_MODES = ("auto", "on", "off")
OVERRIDE_GROUPS = {"lm": ModelConfig, "attention": AttentionConfig, "gate": GateConfig, "rope": RopeConfig}

# Fields that may change between an interrupted run and its resumption (how long to
# train, how often to log/evaluate/save, where the data lives, cosmetic options). Every
# other field must match the checkpoint.
RESUMABLE_FIELDS = frozenset({
    "data_dir", "out_dir", "steps", "max_tokens", "eval_every", "eval_batches", "ckpt_every",
    "keep_checkpoints", "log_every", "stop_at_step", "progress", "tensorboard", "save_code", "compile",
    "activation_checkpointing",
})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ModelRecipe:
    """How to build the model of a run: a size preset, an attention variant, and changes to
    the fields of ``ModelConfig`` (``lm``), ``AttentionConfig``, ``GateConfig`` and
    ``RopeConfig``. The shape (width, heads) comes from the size; the vocabulary and the
    BOS/EOS tokens from the data (:meth:`build`)."""

    size: str = option("tiny", help="model size preset: " + ", ".join(SIZE_PRESETS))
    variant: str = option("baseline", help="attention preset (see `gatedattn variants`)")
    d_model: int | None = option(None, help="width of the residual stream (default: the size preset's; the "
                                           "heads keep their count, the MLP its ratio)")
    lm: dict[str, Any] = option({}, overrides=ModelConfig, flatten=True, help="changes to the ModelConfig fields")
    attention: dict[str, Any] = option({}, overrides=AttentionConfig, help="changes to the AttentionConfig fields")
    gate: dict[str, Any] = option({}, overrides=GateConfig, help="changes to the variant's GateConfig")
    rope: dict[str, Any] = option({}, overrides=RopeConfig, help="changes to the RopeConfig fields")

    def __post_init__(self) -> None:
        if self.size not in SIZE_PRESETS:  # the size preset (--preset on the command line)
            raise ConfigError(f"ModelRecipe.size: preset={self.size!r} is not allowed; choose one of "
                              f"{', '.join(repr(p) for p in SIZE_PRESETS)}")
        check_choice("ModelRecipe", "variant", self.variant, tuple(VARIANTS))
        if self.d_model is not None and (not _is_int(self.d_model) or self.d_model <= 0):
            raise ConfigError(f"ModelRecipe.d_model={self.d_model!r} must be a positive integer (or None: the preset's)")
        for group, owner in OVERRIDE_GROUPS.items():
            object.__setattr__(self, group, _checked_overrides(group, owner, getattr(self, group)))
        if self.gate and not has_gate(self.variant):
            raise ConfigError(f"ModelRecipe.gate={self.gate} cannot apply: variant {self.variant!r} has no gate")
        self.build(vocab_size=256, max_seq_len=None)  # every override applies (fails now, not in a run)

    def build(self, vocab_size: int, max_seq_len: int | None, bos_token_id: int | None = None,
              eos_token_id: int | None = None) -> ModelConfig:
        """The ``ModelConfig`` for a vocabulary; ``max_seq_len`` is the context unless
        ``lm`` sets it (None: 256)."""
        lm = dict(self.lm)
        max_len = lm.pop("max_seq_len", max_seq_len or 256)
        attention = dict(self.attention)
        if self.d_model is not None:
            attention["d_model"] = self.d_model
        if self.gate:
            attention["gate_fields"] = dict(self.gate)
        if self.rope:
            attention["rope"] = RopeConfig(**{"theta": 10000.0, "original_max_len": max_len, **self.rope})
        try:
            cfg = ModelConfig.from_preset(
                self.size, self.variant, vocab_size=vocab_size, max_seq_len=max_len,
                attention_fields=attention, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
            )
            return cfg.replace(**lm) if lm else cfg
        except TypeError as e:  # a field the preset sets itself
            raise ConfigError(f"model overrides {self.overrides()} do not apply: {e}") from None

    def overrides(self) -> dict[str, Any]:
        """The changes as ``{"gate.activation": "silu", "n_layers": 3, ...}``."""
        return {(f"{g}." if g != "lm" else "") + k: v for g in OVERRIDE_GROUPS for k, v in getattr(self, g).items()}

    def to_dict(self) -> dict[str, Any]:
        width = {} if self.d_model is None else {"d_model": self.d_model}  # absent: as written before the field
        return {"size": self.size, "variant": self.variant, **width,
                **{g: dict(getattr(self, g)) for g in OVERRIDE_GROUPS}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelRecipe":
        return build(cls, data)


def has_gate(variant: str) -> bool:
    """Whether the attention preset ``variant`` has a gate (so ``gate`` overrides apply)."""
    return VARIANTS[variant].make(64).get("gate") is not None


def _checked_overrides(group: str, owner: type, values: Any) -> dict[str, Any]:
    """``values`` checked against the settable fields of ``owner`` (strings parsed by type)."""
    if not isinstance(values, dict):
        raise ConfigError(f"ModelRecipe.{group} must be a dict of {owner.__name__} fields, got {type(values).__name__}")
    known = {s.path[-1]: s for s in settings(owner)}
    out = {}
    for name, value in values.items():
        if name not in known:
            raise ConfigError(f"ModelRecipe.{group} has no settable field {name!r}; fields are: {', '.join(known)}")
        typ = known[name].type
        out[name] = parse_value(value, typ, f"{group}.{name}") if isinstance(value, str) and typ is not str else value
    return out


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Every field is checked in ``__post_init__``.

    ``steps`` optimizer updates of ``micro_batch * grad_accum * world_size`` sequences of
    ``seq_len`` tokens each. A run stops early as *diverged* by the rule of
    :meth:`gatedattn.train.trainer.Trainer.stop_reason`. ``data_dir`` and ``out_dir`` may be
    None for a config that only builds a model or times a step; ``train`` needs both.

    ``TrainConfig(variant=..., preset=..., model_overrides={"gate.activation": ...})``
    are shorthands for the fields of ``model`` (a :class:`ModelRecipe`).
    """

    data_dir: str | None = option(None, help="a directory written by `gatedattn data prepare`")
    out_dir: str | None = option(None, help="the run directory")
    model: ModelRecipe = field(default_factory=ModelRecipe, metadata={"help": "the model to build"})
    init_from: str | None = option(None, help="continue training this model (anything gatedattn.hf.load_model reads: "
                                   "a gatedattn or HF Llama/Qwen2/Qwen3 directory) instead of building one: its "
                                   "config and weights replace the size preset and the model.* keys; "
                                   "model.variant other than baseline retrofits that variant's gate (identity init)")
    trainable: tuple[str, ...] = option((), help="train only these parameters and freeze the rest (empty: all "
                                        "train): the groups " + ", ".join(TRAINABLE_GROUPS) + " or fnmatch patterns "
                                        "over parameter names (blocks.*.attn.o_proj.*), comma-separated")
    seq_len: int = option(256, ge=1, help="tokens per training sequence (the context)")
    micro_batch: int = option(16, ge=1, help="sequences per forward pass")
    grad_accum: int = option(1, ge=1, help="micro-batches per optimizer step")
    steps: int = option(1000, ge=1, help="optimizer steps")
    max_tokens: int | None = option(None, ge=1, help="train this many tokens instead (replaces steps)")
    lr: float = option(1e-3, gt=0, help="peak learning rate")
    min_lr_ratio: float = option(0.1, ge=0, le=1, help="final learning rate as a fraction of lr")
    warmup_steps: int = option(100, ge=0, help="linear warm-up steps")
    schedule: str = option("cosine", choices=SCHEDULES, help="decay after warm-up: " + ", ".join(SCHEDULES))
    weight_decay: float = option(0.1, ge=0, help="AdamW weight decay (matrices and embeddings only)")
    betas: tuple[float, float] = option((0.9, 0.95), help="AdamW betas")
    eps: float = option(1e-8, gt=0, help="AdamW epsilon")
    grad_clip: float = option(1.0, ge=0, help="clip the gradient norm to this (0: no clipping)")
    optimizer: str = option("adamw", choices=OPTIMIZERS, help="adamw, or muon (torch.optim.Muon for hidden matrices, AdamW for "
                                          "the rest)")
    muon_momentum: float = option(0.95, ge=0, lt=1, help="Muon momentum")
    dtype: str = option("auto", choices=DTYPES, help="auto (bf16 autocast where the device computes bf16 natively, else "
                                     "fp32), fp32 or bf16")
    compile: str = option("auto", choices=COMPILE_MODES, help="torch.compile the model: on, off, or auto (a run "
                          "whose steps left take 5 minutes or more eagerly times its first steps eager and compiled "
                          "and keeps the faster; shorter runs stay eager); true/false read as on/off")
    activation_checkpointing: int = option(0, ge=0, help="recompute the activations of every Nth block in "
                                           "backward instead of keeping them (1: every block; N: blocks 0, N, "
                                           "2N, ...; 0: off): less memory, same gradients, about one more forward")
    device: str = option("auto", choices=DEVICES, help="auto (CUDA when available), cpu or cuda")
    seed: int = option(0, ge=0, lt=2**63, help="seed of the initial weights and of the data order")
    eval_every: int = option(100, ge=0, help="evaluate every this many steps (0: at the start and end only)")
    eval_batches: int = option(8, ge=1, help="validation batches per evaluation")
    ckpt_every: int = option(500, ge=0, help="checkpoint every this many steps (0: at the end only)")
    keep_checkpoints: int = option(2, ge=0, help="keep the newest this many checkpoints (0: all)")
    log_every: int = option(10, ge=1, help="log a training record every this many steps")
    skip_nonfinite: bool = option(False, help="skip an update with a non-finite loss or gradient instead of "
                                              "stopping (10 in a row: diverged)")
    spike_margin: float = option(0.2, gt=0, help="a loss spike is a loss above the running median by this "
                                           "fraction")
    spike_window: int = option(50, ge=1, le=1_000_000, help="steps in the running median of the spike rule")
    diverge_factor: float = option(2.0, gt=1, help="diverged when the loss exceeds this times the first loss")
    overfit_batches: int = option(0, ge=0, help="cycle through this many batches (> 0: a memorisation check)")
    stop_at_step: int | None = option(None, ge=1, help="end this invocation after this step with a checkpoint "
                                                 "(resume continues)")
    fsdp: bool = option(False, help="shard parameters with FSDP2 under torchrun (else DDP)")
    progress: bool = option(True, help="show a progress bar")
    tensorboard: bool = option(True, help="write TensorBoard event files")
    save_code: bool = option(True, help="write the modelling code beside final/'s weights, so it loads with "
                                        "trust_remote_code=True where gatedattn is not installed (--no-code: false)")
    # constructor shorthands for fields of ``model`` (not fields: to_dict and --set leave them
    # out, and they read back as None; the values are ``model.variant`` and ``model.size``)
    variant: InitVar[str | None] = None
    preset: InitVar[str | None] = None
    model_overrides: InitVar[dict | None] = None

    def __post_init__(self, variant: str | None, preset: str | None, model_overrides: dict | None) -> None:
        if variant is not None or preset is not None or model_overrides is not None:
            if not isinstance(self.model, (ModelRecipe, dict)):
                raise ConfigError(f"TrainConfig.model must be a ModelRecipe, got {type(self.model).__name__}")
            recipe = _recipe_dict(self.model, variant, preset, model_overrides)
            object.__setattr__(self, "model", ModelRecipe.from_dict(recipe))
        self._check_paths()
        # the boolean form before "auto" (compile=True, --set train.compile=true, older runs' config.json)
        if isinstance(self.compile, bool) or self.compile in ("true", "false"):
            object.__setattr__(self, "compile", "on" if self.compile in (True, "true") else "off")
        if not isinstance(self.model, ModelRecipe):
            raise ConfigError(f"TrainConfig.model must be a ModelRecipe, got {type(self.model).__name__}")
        self._check_trainable()
        check_types(self)
        check_options(self)
        betas = self.betas
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)):
            raise ConfigError(f"TrainConfig.betas={betas!r} must be two numbers in [0, 1), e.g. 0.9,0.95")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        self._check_between_fields()

    def _check_paths(self) -> None:
        for name in ("data_dir", "out_dir", "init_from"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"TrainConfig.{name}={value!r} must be a non-empty path or None")

    def _check_trainable(self) -> None:
        """``trainable``: a tuple of non-empty names (a comma-separated string or a list is
        read as one); whether each matches a parameter is checked against the model
        (``gatedattn.train.optim.trainable_names``)."""
        value = self.trainable
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(","))
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"TrainConfig.trainable={value!r} must be a list of group names "
                              f"({', '.join(TRAINABLE_GROUPS)}) or fnmatch patterns over parameter names")
        if any(not v.strip() or v != v.strip() for v in value):
            raise ConfigError(f"TrainConfig.trainable={list(value)!r} has an empty or space-padded entry; give group "
                              f"names ({', '.join(TRAINABLE_GROUPS)}) or fnmatch patterns over parameter names")
        object.__setattr__(self, "trainable", tuple(value))

    def _check_init_from(self) -> None:
        """With ``init_from`` the model comes from that model: a size preset or a change of
        the model's fields conflicts with it; a variant (other than baseline) must be a
        gate or sink to retrofit (the rule of ``gatedattn.hf.add_gates``)."""
        recipe, where = self.model, f"TrainConfig.init_from={self.init_from!r}"
        conflicts = ([f"model.size={recipe.size!r} (--preset)"] if recipe.size != ModelRecipe.size else []) \
            + ([f"model.d_model={recipe.d_model}"] if recipe.d_model is not None else []) \
            + [f"model.{key}={value!r}" for key, value in recipe.overrides().items()]
        if conflicts:
            raise ConfigError(f"{where} takes the model's size and fields from that model; {conflicts[0]} conflicts "
                              f"with it (drop it, or train from a preset without init_from)")
        if recipe.variant != "baseline":
            changes = VARIANTS[recipe.variant].make(64)
            if not changes or set(changes) - {"gate", "sink"}:
                raise ConfigError(f"{where}: model.variant={recipe.variant!r} is not a gate or sink to retrofit "
                                  f"into the model; choose a gated or sink variant, or baseline (the model as it is)")

    def _check_between_fields(self) -> None:
        """The rules that tie two fields together (each field's own bounds are declared)."""
        own = "TrainConfig"
        if self.init_from is not None:
            self._check_init_from()
        max_len = self.model.lm.get("max_seq_len")
        if max_len is not None and max_len < self.seq_len:
            raise ConfigError(f"{own}: model.max_seq_len={max_len} is shorter than seq_len={self.seq_len}; the model "
                              f"would claim a context shorter than it is trained on")
        if self.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
            raise ConfigError(f"{own}.optimizer='muon' needs torch.optim.Muon, which torch {torch.__version__} "
                              "does not have; choose 'adamw' or a newer torch")
        if self.optimizer == "muon" and self.fsdp:
            raise ConfigError(f"{own}.optimizer='muon' is not supported with fsdp=True (Muon orthogonalises whole "
                              "matrices, FSDP shards them); use DDP (fsdp=false) or optimizer 'adamw'")

    # ------------------------------------------------------------------ derived
    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def warmup_problem(self, world_size: int = 1) -> str | None:
        """Why the warm-up does not fit the run (``warmup_steps`` beyond its steps), else None."""
        total = self.total_steps(world_size)
        if self.warmup_steps > total:
            return (f"TrainConfig.warmup_steps={self.warmup_steps} exceeds the {total} steps of the run; "
                    f"the learning rate would never reach lr={self.lr:g}")
        return None

    def global_batch(self, world_size: int = 1) -> int:
        """Sequences per optimizer step."""
        return self.micro_batch * self.grad_accum * world_size

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Predicted tokens per optimizer step (the BOS column is input, not counted)."""
        return self.global_batch(world_size) * self.seq_len

    def total_steps(self, world_size: int = 1) -> int:
        """``steps``, or the steps that cover ``max_tokens`` when that is set."""
        if self.max_tokens is not None:
            return max(1, math.ceil(self.max_tokens / self.tokens_per_step(world_size)))
        return self.steps

    def model_config(self, vocab_size: int, bos_token_id: int | None = None,
                     eos_token_id: int | None = None) -> ModelConfig:
        """The ``ModelConfig`` of this run for a vocabulary (from the data directory); a run
        with ``init_from`` has the init model's instead (``gatedattn.train.loop.run_model``)."""
        if self.init_from is not None:
            raise ConfigError(f"TrainConfig.init_from={self.init_from!r}: the model config is the init model's, "
                              f"not built from the recipe (gatedattn.train.loop.run_model reads it)")
        return self.model.build(vocab_size, self.seq_len, bos_token_id, eos_token_id)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["model"] = self.model.to_dict()
        d["betas"] = list(self.betas)
        for name in ("init_from", "trainable"):  # absent when unset: as written before the fields
            if not d[name]:
                del d[name]
        if "trainable" in d:
            d["trainable"] = list(d["trainable"])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Inverse of ``to_dict``; also reads the flat form written before the model recipe
        (``variant``, ``preset``, ``model_overrides``), so older runs resume."""
        data = upgrade_dict(data)
        for name in ("betas", "trainable"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        if isinstance(data.get("model"), dict):
            data["model"] = ModelRecipe.from_dict(data["model"])
        return build(cls, data)

    @classmethod
    def from_sets(cls, base: dict[str, Any], sets: list[str] | tuple[str, ...] = (),
                  flags: dict[str, str] | None = None) -> "TrainConfig":
        """``TrainConfig(**base)`` with ``KEY=VALUE`` strings applied (:func:`gatedattn.infra.settings.apply_sets`);
        keys in ``flags`` (full key -> option) are refused."""
        return apply_sets(cls(**base), sets, flags)




def upgrade_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A ``TrainConfig.to_dict()`` of the flat form (``variant``, ``preset``,
    ``model_overrides`` as top-level fields) in the current form; other dicts unchanged."""
    if not any(k in data for k in _SHORTHANDS):
        return dict(data)
    data = dict(data)
    recipe = _recipe_dict(data.get("model"), data.pop("variant", None), data.pop("preset", None),
                          data.pop("model_overrides", None))
    data["model"] = recipe
    return data


_SHORTHANDS = ("variant", "preset", "model_overrides")


def _recipe_dict(model: Any, variant: str | None, preset: str | None, overrides: dict | None) -> dict[str, Any]:
    recipe = model.to_dict() if isinstance(model, ModelRecipe) else dict(model or ModelRecipe().to_dict())
    if variant is not None:
        recipe["variant"] = variant
    if preset is not None:
        recipe["size"] = preset
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(f"TrainConfig.model_overrides must be a dict of dotted model keys, got {type(overrides).__name__}")
    known = settings(TrainConfig)
    for key, value in (overrides or {}).items():
        s = resolve(str(key), known)
        if s.path[0] != "model":
            raise ConfigError(f"model_overrides key {key!r} is not a model key")
        group = recipe[s.path[1]] = dict(recipe.get(s.path[1]) or {})
        group[s.path[2]] = value
    return recipe




def settable_keys() -> list[str]:
    """Every key ``--set`` accepts for a training run."""
    return [s.key for s in settings(TrainConfig)]


def config_diff(a: Any, b: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The key path of the first difference between two JSON-like values, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return (*path, k)
            d = config_diff(a[k], b[k], (*path, k))
            if d is not None:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        same = len(a) == len(b) and all(config_diff(x, y) is None for x, y in zip(a, b))
        return None if same else path
    return None if a == b else path


def lookup(d: Any, path: tuple[str, ...]) -> Any:
    """``d[path[0]][path[1]]...``; ``"<absent>"`` where a key is missing."""
    for part in path:
        if not isinstance(d, dict) or part not in d:
            return "<absent>"
        d = d[part]
    return d


def parse_sets(sets: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["lr=3e-3", "gate.activation=silu"]`` -> ``{"lr": 0.003, "model.gate.activation": "silu"}``
    (full keys; values parsed by type)."""
    by_path = {s.path: s.key for s in settings(TrainConfig)}
    return {by_path[path]: value for path, value in parse_paths(TrainConfig, sets).items()}
