"""``TrainConfig``: everything one training run needs, validated on construction.

A run is named by its attention ``variant`` and model size ``preset`` plus optional model
overrides (dotted keys ``model.*``, ``attention.*``, ``gate.*``, ``rope.*``), the data
directory, the batch geometry and the optimiser settings. ``--set KEY=VALUE`` on the
command line takes the field names of ``TrainConfig`` and those dotted model keys;
values are parsed by the field's type (:func:`parse_sets`).

The global batch is ``micro_batch * grad_accum * world_size`` rows of ``seq_len`` tokens
(plus the BOS column the data adds); ``world_size`` is the number of data-parallel
processes (1 without ``torchrun``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import torch

from gatedattn.config import AttentionConfig, GateConfig, RopeConfig
from gatedattn.errors import ConfigError, check_choice
from gatedattn.model import SIZE_PRESETS, ModelConfig
from gatedattn.precision import DTYPES
from gatedattn.variants import VARIANTS

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "linear", "constant")
DEVICES = ("auto", "cpu", "cuda")

# Model keys settable with --set: group -> fields. The model's shape (d_model, heads)
# comes from the size preset; vocab and BOS/EOS come from the data directory.
MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("n_layers", "ffn_dim", "max_seq_len", "tie_embeddings", "norm_eps", "init_std"),
    "attention": ("kv", "qk_norm", "qkv_bias", "norm_eps", "head_transform", "sink", "kernel"),
    "gate": tuple(f.name for f in dataclasses.fields(GateConfig)),
    "rope": tuple(f.name for f in dataclasses.fields(RopeConfig)),
}
_MODEL_KEY_OWNERS = {"model": ModelConfig, "attention": AttentionConfig, "gate": GateConfig, "rope": RopeConfig}

# Fields that may change between an interrupted run and its resumption (how long to
# train, how often to log/evaluate/save, where the data lives, cosmetic options). Every
# other field must match the checkpoint.
RESUMABLE_FIELDS = frozenset({
    "data_dir", "out_dir", "steps", "max_tokens", "eval_every", "eval_batches", "ckpt_every",
    "keep_checkpoints", "log_every", "stop_at_step", "progress", "tensorboard", "compile",
})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Every field is checked in ``__post_init__``.

    ``steps`` optimizer updates of ``micro_batch * grad_accum * world_size`` sequences of
    ``seq_len`` tokens each; ``max_tokens`` (when set) replaces ``steps`` by the number of
    steps that covers that many tokens. The learning rate warms up linearly over
    ``warmup_steps`` to ``lr``, then decays (``schedule``) to ``lr * min_lr_ratio`` at the
    last step. ``grad_clip`` 0 disables clipping. ``optimizer="muon"`` uses
    ``torch.optim.Muon`` for the 2-D hidden matrices (projections inside the blocks) and
    AdamW for embeddings, norms, gains, static gates and sinks.

    ``eval_every`` / ``ckpt_every`` / ``log_every`` are in steps (0: only at the start
    and end for evaluation, only at the end for checkpoints). ``spike_margin`` and
    ``spike_window``: a step is a loss spike when its loss is above the median of the
    previous ``spike_window`` losses by ``spike_margin`` (relative, 0.2 = 20 %), as
    :func:`gatedattn.analysis.loss_spikes`. A run stops early as *diverged* when its
    loss is non-finite (unless ``skip_nonfinite``, which skips that update instead) or
    above ``diverge_factor`` times the first step's loss.

    ``overfit_batches`` > 0 cycles through the first that many batches (a check that
    the model can memorise). ``stop_at_step`` ends this invocation after that step with
    a checkpoint, so ``resume`` continues it.
    """

    data_dir: str
    out_dir: str
    variant: str = "baseline"
    preset: str = "tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    seq_len: int = 256
    micro_batch: int = 16
    grad_accum: int = 1
    steps: int = 1000
    max_tokens: int | None = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    optimizer: str = "adamw"
    muon_momentum: float = 0.95
    dtype: str = "auto"
    compile: bool = False
    device: str = "auto"
    seed: int = 0
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    skip_nonfinite: bool = False
    spike_margin: float = 0.2
    spike_window: int = 50
    diverge_factor: float = 2.0
    overfit_batches: int = 0
    stop_at_step: int | None = None
    fsdp: bool = False
    progress: bool = True
    tensorboard: bool = True

    def __post_init__(self) -> None:
        own = "TrainConfig"
        for name in ("data_dir", "out_dir"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif not isinstance(value, str) or not value:
                raise ConfigError(f"{own}.{name}={value!r} must be a non-empty path")
        check_choice(own, "variant", self.variant, tuple(VARIANTS))
        check_choice(own, "preset", self.preset, tuple(SIZE_PRESETS))
        if not isinstance(self.model_overrides, dict):
            raise ConfigError(f"{own}.model_overrides must be a dict of dotted model keys, got {type(self.model_overrides).__name__}")
        object.__setattr__(self, "model_overrides", {k: _check_model_key(k, v) for k, v in self.model_overrides.items()})

        def integer(name: str, low: int, none_ok: bool = False) -> None:
            v = getattr(self, name)
            if v is None and none_ok:
                return
            if not _is_int(v) or v < low:
                raise ConfigError(f"{own}.{name}={v!r} must be an integer >= {low}" + (" or None" if none_ok else ""))

        def number(name: str, low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> None:
            v = getattr(self, name)
            if not _is_number(v) or not math.isfinite(v):
                raise ConfigError(f"{own}.{name}={v!r} must be a finite number")
            object.__setattr__(self, name, float(v))
            if (v <= low if low_open else v < low) or (v >= high if high_open else v > high):
                lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
                raise ConfigError(f"{own}.{name}={v!r} must be in {lo}{low:g}, {high:g}{hi}")

        def boolean(name: str) -> None:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{own}.{name}={getattr(self, name)!r} must be true or false")

        integer("seq_len", 1)
        integer("micro_batch", 1)
        integer("grad_accum", 1)
        integer("steps", 1)
        integer("max_tokens", 1, none_ok=True)
        number("lr", 0.0, low_open=True)
        number("min_lr_ratio", 0.0, 1.0)
        integer("warmup_steps", 0)
        check_choice(own, "schedule", self.schedule, SCHEDULES)
        number("weight_decay", 0.0)
        betas = self.betas
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)):
            raise ConfigError(f"{own}.betas={betas!r} must be two numbers in [0, 1), e.g. 0.9,0.95")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        number("eps", 0.0, low_open=True)
        number("grad_clip", 0.0)
        check_choice(own, "optimizer", self.optimizer, OPTIMIZERS)
        number("muon_momentum", 0.0, 1.0, high_open=True)
        check_choice(own, "dtype", self.dtype, DTYPES)
        boolean("compile")
        check_choice(own, "device", self.device, DEVICES)
        integer("seed", 0)
        integer("eval_every", 0)
        integer("eval_batches", 1)
        integer("ckpt_every", 0)
        integer("keep_checkpoints", 0)
        integer("log_every", 1)
        boolean("skip_nonfinite")
        number("spike_margin", 0.0, low_open=True)
        integer("spike_window", 1)
        number("diverge_factor", 1.0, low_open=True)
        integer("overfit_batches", 0)
        integer("stop_at_step", 1, none_ok=True)
        boolean("fsdp")
        boolean("progress")
        boolean("tensorboard")
        if self.optimizer == "muon":
            if not hasattr(torch.optim, "Muon"):
                raise ConfigError(
                    f"{own}.optimizer='muon' needs torch.optim.Muon, which torch {torch.__version__} "
                    "does not have; choose 'adamw' or a newer torch"
                )
            if self.fsdp:
                raise ConfigError(
                    f"{own}.optimizer='muon' is not supported with fsdp=True (Muon orthogonalises whole "
                    "matrices, FSDP shards them); use DDP (fsdp=false) or optimizer 'adamw'"
                )

    # ------------------------------------------------------------------ derived
    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

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
        """The ``ModelConfig`` of this run for a vocabulary (from the data directory)."""
        groups: dict[str, dict[str, Any]] = {g: {} for g in MODEL_KEYS}
        for key, value in self.model_overrides.items():
            group, name = key.split(".", 1)
            groups[group][name] = value
        max_seq_len = groups["model"].pop("max_seq_len", self.seq_len)
        attention = dict(groups["attention"])
        if groups["gate"]:
            attention["gate_fields"] = groups["gate"]
        if groups["rope"]:
            attention["rope"] = RopeConfig(**{"theta": 10000.0, "original_max_len": max_seq_len, **groups["rope"]})
        try:
            cfg = ModelConfig.from_preset(
                self.preset, self.variant, vocab_size=vocab_size, max_seq_len=max_seq_len,
                attention_fields=attention, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
            )
            return cfg.replace(**groups["model"]) if groups["model"] else cfg
        except TypeError as e:  # a field the preset sets itself
            raise ConfigError(f"model overrides {sorted(self.model_overrides)} do not apply: {e}") from None

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"TrainConfig has no field {unknown[0]!r}; fields are: {', '.join(sorted(known))}")
        data = dict(data)
        if isinstance(data.get("betas"), list):
            data["betas"] = tuple(data["betas"])
        return cls(**data)

    @classmethod
    def from_sets(cls, base: dict[str, Any], sets: list[str] | tuple[str, ...] = ()) -> "TrainConfig":
        """``TrainConfig(**base)`` with ``KEY=VALUE`` strings applied (see :func:`parse_sets`)."""
        fields, overrides = parse_sets(sets)
        merged = {**base, **fields}
        if overrides:
            merged["model_overrides"] = {**merged.get("model_overrides", {}), **overrides}
        return cls(**merged)


# ---------------------------------------------------------------------------- --set parsing
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def settable_keys() -> list[str]:
    """Every key ``--set`` accepts: TrainConfig fields, then dotted model keys."""
    train = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "model_overrides"]
    model = [f"{g}.{n}" for g, names in MODEL_KEYS.items() for n in names]
    return train + model


def _unknown_key(key: str) -> ConfigError:
    keys = settable_keys()
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown --set key {key!r}{hint}; valid keys: {', '.join(keys)}")


def _field_type(owner: type, name: str) -> Any:
    return typing.get_type_hints(owner)[name]


def parse_value(text: str, typ: Any, key: str) -> Any:
    """Parse the string ``text`` as a value of type ``typ`` (bool, int, float, str, tuples
    of floats, ``X | None``); a bad value names the key and the expected type. ``typ``
    may also be a string annotation such as ``"int | None"``."""
    if isinstance(typ, str):
        names = {"int": int, "float": float, "bool": bool, "str": str, "tuple": tuple, "dict": dict,
                 "list": list, "Any": Any, "None": None}
        try:
            typ = eval(typ, {"__builtins__": {}}, names)  # noqa: S307 (a fixed namespace of type names)
        except Exception:
            raise ConfigError(f"--set {key}: values of type {typ} cannot be set from the command line") from None
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.strip().lower() in ("none", "null"):
            return None
        if len(args) == 1:
            return parse_value(text, args[0], key)
    s = text.strip()
    if typ is bool:
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise ConfigError(f"--set {key}={text!r}: expected true or false")
    if typ is int:
        try:
            return int(s)
        except ValueError:
            try:
                f = float(s)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f.is_integer():
                return int(f)
            raise ConfigError(f"--set {key}={text!r}: expected an integer") from None
    if typ is float:
        try:
            return float(s)
        except ValueError:
            raise ConfigError(f"--set {key}={text!r}: expected a number") from None
    if typ is str:
        return s
    if origin is tuple:
        parts = [p for p in s.split(",")]
        elem = typing.get_args(typ)
        if len(parts) != len(elem):
            raise ConfigError(f"--set {key}={text!r}: expected {len(elem)} comma-separated values")
        return tuple(parse_value(p, t, key) for p, t in zip(parts, elem))
    raise ConfigError(f"--set {key}: values of type {typ} cannot be set from the command line")


def parse_sets(sets: list[str] | tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``["lr=3e-3", "gate.activation=silu"]`` -> (TrainConfig fields, model overrides)."""
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"model_overrides"}
    fields: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        if key in train_fields:
            fields[key] = parse_value(text, _field_type(TrainConfig, key), key)
        elif "." in key:
            group, name = key.split(".", 1)
            if name not in MODEL_KEYS.get(group, ()):
                raise _unknown_key(key)
            overrides[key] = parse_value(text, _field_type(_MODEL_KEY_OWNERS[group], name), key)
        else:
            raise _unknown_key(key)
    return fields, overrides


def _check_model_key(key: Any, value: Any) -> Any:
    """Validate one ``model_overrides`` entry given in Python (type and key)."""
    if not isinstance(key, str) or "." not in key:
        raise _unknown_key(str(key))
    group, name = key.split(".", 1)
    if name not in MODEL_KEYS.get(group, ()):
        raise _unknown_key(key)
    typ = _field_type(_MODEL_KEY_OWNERS[group], name)
    if isinstance(value, str) and typ is not str:
        return parse_value(value, typ, key)
    return value


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
