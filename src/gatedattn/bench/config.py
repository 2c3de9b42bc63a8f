"""What ``gatedattn bench`` measures: shapes, variants, repeats; validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from gatedattn.infra.errors import ConfigError, check_choice, check_types
from gatedattn.infra.precision import DTYPES
from gatedattn.infra.settings import check_options, option
from gatedattn.layers.variants import VARIANTS

DEVICES = ("auto", "cpu", "cuda")
DEFAULT_VARIANTS = ("baseline", "gated", "gated-headwise", "sink", "hyga", "hyga-lowrank", "hyga-sink")
REFERENCE = "baseline"  # every ratio is against this variant, measured in the same run


MAX_ROUNDS = 10_000  # timed or warm-up rounds per workload: beyond it a count is a typo (it would run for days)


@dataclass(frozen=True)
class Shape:
    """One benchmark shape. The attention layer is ``d_model`` wide with ``n_heads`` query and
    ``n_kv_heads`` key/value heads; it runs on ``batch`` sequences of ``seq_len`` tokens. The
    training step and decoding use a ``GatedLM`` of ``n_layers`` blocks, ``ffn_dim`` MLP width and
    ``vocab_size`` tokens. Decoding generates ``decode_new`` tokens after a prompt of
    ``seq_len - decode_new`` tokens, so the cache ends ``seq_len`` long."""

    name: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    seq_len: int
    batch: int
    n_layers: int
    ffn_dim: int
    vocab_size: int
    decode_new: int

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_kv_heads", "seq_len", "batch", "n_layers", "ffn_dim", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"Shape.{name}={v!r} must be an integer >= 1")
        if not isinstance(self.decode_new, int) or not 2 <= self.decode_new < self.seq_len:
            raise ConfigError(f"Shape.decode_new={self.decode_new!r} must be an integer in [2, seq_len={self.seq_len})")

    @property
    def decode_prompt(self) -> int:
        return self.seq_len - self.decode_new

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "decode_prompt": self.decode_prompt}


SHAPES = (
    Shape("default", d_model=256, n_heads=4, n_kv_heads=4, seq_len=512, batch=4, n_layers=2, ffn_dim=768,
          vocab_size=2048, decode_new=64),
    Shape("long", d_model=256, n_heads=4, n_kv_heads=4, seq_len=4096, batch=1, n_layers=2, ffn_dim=768,
          vocab_size=2048, decode_new=64),
)
QUICK_SHAPES = (
    Shape("default", d_model=32, n_heads=2, n_kv_heads=2, seq_len=32, batch=2, n_layers=1, ffn_dim=64,
          vocab_size=64, decode_new=4),
    Shape("long", d_model=32, n_heads=2, n_kv_heads=2, seq_len=64, batch=1, n_layers=1, ffn_dim=64,
          vocab_size=64, decode_new=4),
)


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark run. ``variants`` are presets of ``gatedattn variants``; ``baseline`` is
    always measured (first) because every ratio is taken against it. ``repeats`` timed rounds
    follow ``warmup`` untimed ones, and more rounds follow while a workload's spread is
    ``max_spread`` or more, until the timed rounds of a group (one kind of workload at one
    shape) have taken ``time_cap_s``; ``quick`` uses tiny shapes for a smoke test."""

    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    shapes: tuple[Shape, ...] = SHAPES
    repeats: int = 7
    warmup: int = 2
    hf: bool = True
    max_spread: float = option(0.05, help="repeat a group of workloads until each one's spread (interquartile "
                                          "range / median) is below this", gt=0.0, le=1.0)
    time_cap_s: float = option(120.0, help="seconds of timed rounds per group of workloads after which no more "
                                           "rounds are added (0: exactly `repeats` rounds)", ge=0.0, le=86400.0)

    def __post_init__(self) -> None:
        check_types(self)
        check_options(self)
        check_choice("BenchConfig", "device", self.device, DEVICES)
        check_choice("BenchConfig", "dtype", self.dtype, DTYPES)
        if not isinstance(self.variants, (tuple, list)) or not self.variants:
            raise ConfigError(f"BenchConfig.variants={self.variants!r} must be a non-empty list of presets")
        for v in self.variants:
            check_choice("BenchConfig", "variants", v, tuple(VARIANTS))
        variants = (REFERENCE, *[v for v in dict.fromkeys(self.variants) if v != REFERENCE])
        object.__setattr__(self, "variants", variants)
        if not self.shapes or not all(isinstance(s, Shape) for s in self.shapes):
            raise ConfigError("BenchConfig.shapes must be a non-empty tuple of Shape")
        for name, low in (("repeats", 1), ("warmup", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_ROUNDS:
                raise ConfigError(f"BenchConfig.{name}={v!r} must be an integer in [{low}, {MAX_ROUNDS:,}]")

    @classmethod
    def quick(cls, **fields) -> "BenchConfig":
        """Tiny shapes, one warm-up and two timed rounds (no more): seconds, for tests."""
        return cls(**{"shapes": QUICK_SHAPES, "repeats": 2, "warmup": 1, "time_cap_s": 0.0, **fields})
