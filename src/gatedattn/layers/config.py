"""Configuration of one attention variant.

``AttentionConfig`` names a variant completely. It is a frozen dataclass made of
small frozen parts: ``RopeConfig`` (positions), ``MLAConfig`` (latent KV, optional),
``GateConfig`` (the gates of both papers, optional). Every invalid value or
combination fails in ``__post_init__`` with a message naming the field and the
allowed values, so a bad variant never reaches training. docs/design.md section 1 tables
every ``GateConfig`` axis, section 2 HyGA's fields, section 3 the sink.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from gatedattn.infra.errors import check_types, ConfigError, check_choice, refuse_assignment
from gatedattn.infra.settings import build, option
from gatedattn.infra.sizes import check_attention_limits

GATE_POSITIONS = ("g1", "g2", "g3", "g4", "g5")
GRANULARITIES = ("elementwise", "headwise")
ACTIVATIONS = ("sigmoid", "silu", "ns-sigmoid", "identity")
COMBINES = ("multiply", "add")
GATE_SOURCES = ("input", "static", "none")
FUSIONS = ("add", "multiply")
HEAD_TRANSFORMS = ("none", "rmsnorm", "silu")
KV_LAYOUTS = ("gqa", "mla")
KERNELS = ("auto", "sdpa", "flash-lse", "reference")
ROPE_SCALINGS = ("none", "linear", "ntk", "yarn")


def _positive(owner: str, name: str, value: int | float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{owner}.{name}={value!r} must be {bound}")


@refuse_assignment
@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding.

    ``fraction`` < 1 rotates only the first ``fraction * head_dim`` channels of each
    head (partial RoPE, as in Qwen3-Next). ``scaling`` stretches the positions for
    length extrapolation: ``linear`` (position interpolation), ``ntk`` (NTK-aware base
    change) or ``yarn`` (by-parts interpolation plus attention temperature), each by
    ``factor`` relative to ``original_max_len``.
    """

    theta: float = option(10000.0, help="RoPE base: channel pair i turns at theta^(-2i/rot_dim) per position")
    fraction: float = option(1.0, help="share of each head's channels that rotate (partial RoPE; 1 = all)")
    scaling: str = option("none", help="position scaling for extrapolation: none, linear, ntk, yarn")
    factor: float = option(1.0, help="scaling factor (>= 1) relative to original_max_len")
    original_max_len: int = option(2048, help="the context the scaling is relative to (the training context)")
    beta_fast: float = option(32.0, help="YaRN: rotations per context above which a channel is not interpolated")
    beta_slow: float = option(1.0, help="YaRN: rotations per context below which a channel is fully interpolated")

    def __post_init__(self) -> None:
        check_types(self)
        _positive("RopeConfig", "theta", self.theta)
        if not 0.0 <= self.fraction <= 1.0:
            raise ConfigError(f"RopeConfig.fraction={self.fraction!r} must be in [0, 1]")
        check_choice("RopeConfig", "scaling", self.scaling, ROPE_SCALINGS)
        if self.factor < 1.0:
            raise ConfigError(f"RopeConfig.factor={self.factor!r} must be >= 1")
        _positive("RopeConfig", "original_max_len", self.original_max_len)
        if self.beta_fast <= self.beta_slow:
            raise ConfigError(
                f"RopeConfig.beta_fast={self.beta_fast!r} must be > beta_slow={self.beta_slow!r}"
            )


@refuse_assignment
@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2): keys and values come from a shared
    low-rank latent of width ``kv_rank``; ``rope_dim`` extra query/key channels carry
    the (decoupled) rotary position, shared by all heads on the key side. ``q_rank`` > 0
    also factorises the query projection."""

    kv_rank: int = option(128, help="width of the shared key/value latent")
    rope_dim: int = option(32, help="decoupled rotary channels per query/key head (even)")
    q_rank: int = option(0, help="width of the query latent (0: a full-rank query projection)")

    def __post_init__(self) -> None:
        check_types(self)
        _positive("MLAConfig", "kv_rank", self.kv_rank)
        _positive("MLAConfig", "rope_dim", self.rope_dim)
        if self.rope_dim % 2:
            raise ConfigError(f"MLAConfig.rope_dim={self.rope_dim!r} must be even")
        _positive("MLAConfig", "q_rank", self.q_rank, allow_zero=True)


@refuse_assignment
@dataclass(frozen=True)
class GateConfig:
    """The gates of Gated Attention (Qiu et al. 2025) and HyGA.

    The *X-gate* computes logits from the layer input ``X`` (``source="input"``) or
    learns them as constants (``source="static"``); ``rank`` > 0 makes it low-rank,
    ``SiLU(X W_d) W_u``. It gates the tensor at ``position`` with ``activation``,
    either multiplicatively (``Y * g``) or additively (``Y + g``). ``granularity``
    is one score per channel or per head; ``shared`` uses one gate for all heads.

    At ``g1`` two HyGA gates may join: the *H-gate* (``h_dim`` > 0), logits from each
    head's own SDPA output through a per-head MLP of inner width ``h_dim``, fused with
    the X-gate logits by ``fusion`` (``add``: act(x + h); ``multiply``: act(x) * act(h));
    and the *C-gate* (``cross_head``), a headwise sigmoid from all heads' outputs.
    """

    position: str = option("g1", help="where the gate acts: g1 after SDPA, g2 value, g3 key, g4 query, "
                                      "g5 after W_O")
    granularity: str = option("elementwise", help="elementwise (one score per channel) or headwise (per head)")
    shared: bool = option(False, help="one gate shared by all heads instead of one per head")
    activation: str = option("sigmoid", help="score function: sigmoid, silu, ns-sigmoid (0.5 + 0.5 sigmoid), "
                                             "identity")
    combine: str = option("multiply", help="multiply (Y * g) or add (Y + g)")
    source: str = option("input", help="X-gate logits: input (X W), static (learned constants) or none")
    rank: int = option(0, help="X-gate inner width: > 0 makes it low-rank, SiLU(X W_d) W_u")
    bias: bool = option(False, help="a bias on the X-gate logits")
    h_dim: int = option(0, help="HyGA H-gate inner width (0: no H-gate); logits from each head's own output")
    fusion: str = option("add", help="X and H logits: add (act(x + h)) or multiply (act(x) * act(h))")
    cross_head: bool = option(False, help="HyGA C-gate: a headwise sigmoid computed from all heads' outputs")

    def __post_init__(self) -> None:
        check_types(self)
        owner = "GateConfig"
        check_choice(owner, "position", self.position, GATE_POSITIONS)
        check_choice(owner, "granularity", self.granularity, GRANULARITIES)
        check_choice(owner, "activation", self.activation, ACTIVATIONS)
        check_choice(owner, "combine", self.combine, COMBINES)
        check_choice(owner, "source", self.source, GATE_SOURCES)
        check_choice(owner, "fusion", self.fusion, FUSIONS)
        _positive(owner, "rank", self.rank, allow_zero=True)
        _positive(owner, "h_dim", self.h_dim, allow_zero=True)
        if self.rank and self.source != "input":
            raise ConfigError(
                f"GateConfig.rank={self.rank} needs source='input' (a low-rank gate is a "
                f"function of X), got source={self.source!r}"
            )
        if self.position == "g5" and (self.granularity != "elementwise" or self.shared):
            raise ConfigError(
                "GateConfig.position='g5' gates the output of W_O, which has no heads: "
                "it allows granularity='elementwise' and shared=False only"
            )
        hyga = self.h_dim > 0 or self.cross_head
        if hyga and self.position != "g1":
            raise ConfigError(
                f"GateConfig.h_dim / cross_head need position='g1' (they gate the SDPA "
                f"output), got position={self.position!r}"
            )
        if self.h_dim and self.shared:
            raise ConfigError("GateConfig.h_dim > 0 (H-gate, one MLP per head) needs shared=False")
        if self.source == "none" and not hyga:
            raise ConfigError(
                "GateConfig.source='none' leaves no gate: set h_dim > 0 or cross_head=True, "
                "or choose source 'input' or 'static'"
            )
        if self.combine == "add" and (self.h_dim or self.cross_head):
            raise ConfigError("GateConfig.combine='add' is an X-gate ablation; HyGA gates need 'multiply'")


@refuse_assignment
@dataclass(frozen=True)
class AttentionConfig:
    """One causal self-attention variant.

    Shapes: ``n_heads`` query heads of ``head_dim`` channels; ``n_kv_heads`` key/value
    heads (GQA; MHA when equal). With ``kv="mla"`` keys and values come from a latent
    (see ``MLAConfig``). ``qk_norm`` adds Qwen3's per-head RMSNorm on q and k.
    ``qkv_bias`` puts a bias on the q/k/v projections (Qwen2), ``o_bias`` one on the
    output projection (GPT-OSS, Llama/Qwen3 with ``attention_bias``).
    ``head_transform`` applies a non-gate non-linearity to each head's SDPA output
    (per-head RMSNorm or parameter-free SiLU, the paper's comparisons). ``sink`` adds a
    learnable per-head sink logit to the softmax (GPT-OSS), whose value at initialisation
    is ``sink_init`` (0: the sink weighs as one key of score 0). ``kernel`` picks the
    attention core: ``auto`` (SDPA, or the fused kernel that returns the log-sum-exp
    when a sink is on), ``sdpa``, ``flash-lse`` or the plain ``reference``.
    """

    d_model: int = field(metadata={"set": False, "help": "width of the residual stream"})
    n_heads: int = field(metadata={"set": False, "help": "query heads"})
    n_kv_heads: int | None = option(None, set=False, help="key/value heads (GQA; None: n_heads)")
    head_dim: int | None = option(None, set=False, help="channels per head (None: d_model / n_heads)")
    kv: str = option("gqa", help="key/value layout: gqa or mla (latent KV)")
    mla: MLAConfig | None = option(None, set=False, help="the MLA latent shapes (with kv='mla')")
    rope: RopeConfig = field(default_factory=RopeConfig, metadata={"set": False, "help": "rotary positions"})
    qk_norm: bool = option(False, help="per-head RMSNorm on queries and keys (Qwen3)")
    qkv_bias: bool = option(False, help="biases on the q/k/v projections (Qwen2)")
    o_bias: bool = option(False, help="a bias on the output projection")
    norm_eps: float = option(1e-6, help="epsilon of the attention's RMSNorms")
    gate: GateConfig | None = option(None, set=False, help="the gates (None: ungated)")
    head_transform: str = option("none", help="non-gate non-linearity on each head's output: none, rmsnorm, silu")
    sink: bool = option(False, help="a learnable per-head sink logit in the softmax (GPT-OSS)")
    sink_init: float = option(0.0, help="the sink logits' initial value (with sink=True; 0: as one key of score 0)")
    kernel: str = option("auto", help="attention core: auto, sdpa, flash-lse (returns the log-sum-exp), reference")

    def __post_init__(self) -> None:
        check_types(self)
        owner = "AttentionConfig"
        _positive(owner, "d_model", self.d_model)
        _positive(owner, "n_heads", self.n_heads)
        check_attention_limits(self)  # a size past any real model's is a typo, named before the divisibility checks
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"AttentionConfig.d_model={self.d_model} is not divisible by "
                    f"n_heads={self.n_heads}; set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        _positive(owner, "n_kv_heads", self.n_kv_heads)
        _positive(owner, "head_dim", self.head_dim)
        check_attention_limits(self)  # and the head_dim / n_kv_heads the defaults filled in
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"AttentionConfig.n_heads={self.n_heads} must be divisible by "
                f"n_kv_heads={self.n_kv_heads} (each KV head serves a whole group of query heads)"
            )
        check_choice(owner, "kv", self.kv, KV_LAYOUTS)
        check_choice(owner, "head_transform", self.head_transform, HEAD_TRANSFORMS)
        check_choice(owner, "kernel", self.kernel, KERNELS)
        _positive(owner, "norm_eps", self.norm_eps)
        for name, typ in (("rope", RopeConfig), ("gate", GateConfig), ("mla", MLAConfig)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, typ):
                raise ConfigError(f"AttentionConfig.{name} must be a {typ.__name__}, got {type(value).__name__}")
        if self.kv == "mla":
            if self.mla is None:
                object.__setattr__(self, "mla", MLAConfig())
            if self.n_kv_heads != self.n_heads:
                raise ConfigError(
                    f"AttentionConfig.kv='mla' needs n_kv_heads == n_heads (every head reads "
                    f"the shared latent), got n_kv_heads={self.n_kv_heads}, n_heads={self.n_heads}"
                )
            if self.qk_norm:
                raise ConfigError("AttentionConfig.qk_norm=True is not defined for kv='mla' (MLA normalises its latent)")
            if self.rope.fraction != 1.0:
                raise ConfigError("AttentionConfig.rope.fraction must be 1.0 with kv='mla' (MLA has its own rope_dim)")
        elif self.mla is not None:
            raise ConfigError("AttentionConfig.mla is set but kv='gqa'; set kv='mla' or drop mla")
        rotated = self.head_dim * self.rope.fraction
        if self.kv == "gqa" and (rotated != int(rotated) or int(rotated) % 2):
            raise ConfigError(
                f"AttentionConfig.rope.fraction={self.rope.fraction} rotates "
                f"{rotated:g} of head_dim={self.head_dim} channels; it must be a whole, even number"
            )
        self._check_sink()

    def _check_sink(self) -> None:
        if not math.isfinite(self.sink_init):
            raise ConfigError(f"AttentionConfig.sink_init={self.sink_init} must be a finite number")
        if self.sink_init != 0.0 and not self.sink:
            raise ConfigError(f"AttentionConfig.sink_init={self.sink_init:g} needs sink=True (there is no sink to "
                              f"initialise); set sink=True or leave sink_init at 0")
        if self.sink and self.kernel == "sdpa":
            raise ConfigError(
                "AttentionConfig.sink=True needs the attention log-sum-exp, which kernel='sdpa' "
                "does not return; choose kernel 'auto', 'flash-lse' or 'reference'"
            )

    # Derived shapes -------------------------------------------------------------
    @property
    def qk_dim(self) -> int:
        """Channels of each query/key head (MLA adds its decoupled RoPE channels)."""
        return self.head_dim + (self.mla.rope_dim if self.kv == "mla" else 0)

    @property
    def v_dim(self) -> int:
        return self.head_dim

    @property
    def resolved_kernel(self) -> str:
        if self.kernel != "auto":
            return self.kernel
        return "flash-lse" if self.sink else "sdpa"

    def replace(self, **changes: Any) -> "AttentionConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttentionConfig":
        """Inverse of ``to_dict``; unknown keys are an error naming the key."""
        data = dict(data)
        parts = {"rope": RopeConfig, "mla": MLAConfig, "gate": GateConfig}
        for name, typ in parts.items():
            if isinstance(data.get(name), dict):
                data[name] = build(typ, data[name], f"AttentionConfig.{name}")
        return build(cls, data, "AttentionConfig")
