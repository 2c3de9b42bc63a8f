"""A decoder-only language model in the Qwen3 family shape, with any attention variant.

Token embedding -> n_layers x [x + attn(norm(x)); x + mlp(norm(x))] -> norm -> LM head.
The attention of every block is ``gatedattn.Attention`` built from one
``AttentionConfig``; the MLP is SwiGLU (or OPT/GPT-2's two-matrix MLP, ``mlp``). ``GatedLM(ids)`` returns logits (B, T, vocab).

Padded batches follow transformers' conventions: ``attention_mask`` (B, past + T) holds 1
for tokens and 0 for padding (left or right), padded keys get zero attention, and the
positions default to ``cumsum(attention_mask) - 1``, so a left-padded row computes at its
tokens what the same row computes unpadded. A mask without zeros is dropped before the
blocks: the unpadded path runs the same kernels as no mask at all.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gatedattn.layers.attention import Attention
from gatedattn.layers.cache import KVCache
from gatedattn.layers.checks import check_generate_args, check_map_location
from gatedattn.layers.config import AttentionConfig, RopeConfig
from gatedattn.infra.errors import ConfigError, GatedAttnError, check_types, refuse_assignment
from gatedattn.layers.gates import Gate
from gatedattn.infra.integrity import (atomic_model_dir, record as record_checksum,
                                       verify_dir, verify_file)
from gatedattn.infra.io import atomic_write_json, read_json_object, recover_missing
from gatedattn.layers.norm import RMSNorm
from gatedattn.layers.packing import apply_linear, packed_linear
from gatedattn.layers.rope import RopeTables, Rotary
from gatedattn.infra.settings import build, check_options, option
from gatedattn.infra.sizes import check_memory, check_model_limits, check_model_size, kv_cache_bytes_per_token
from gatedattn.layers.variants import get_variant
from gatedattn.models.casts import FrozenCasts
from gatedattn.models.code import write_code
from gatedattn.models.decode import (EagerSteps, StaticSteps, check_compile, compiles, decode_tokens,
                                     static_capacity)
from gatedattn.models.shards import read_safetensors as _moved_read_safetensors, read_weights, write_weights
from gatedattn.models.standard import check_standard_keys, split_standard_keys, standard_keys
from gatedattn.ops.lm_loss import linear_cross_entropy

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_TYPE = "gatedattn"
# config.json keys that describe the file, not the model
_NOT_CONFIG_KEYS = ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map")

NORMS = ("rms", "layer")
MLPS = ("swiglu", "relu", "gelu")
POSITION_EMBEDDINGS = ("none", "learned")

# name -> (n_layers, d_model, n_heads, n_kv_heads, ffn_dim)
SIZE_PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "micro": (2, 64, 4, 2, 192),     # unit tests
    "toy": (1, 64, 1, 1, 128),       # one head: the Bigram-Backcopy mechanism study
    "tiny": (4, 128, 4, 2, 384),     # smoke runs, ~0.8 M non-embedding params
    "small": (6, 256, 4, 4, 768),    # the CPU reproduction, ~5.1 M non-embedding params
    "base": (12, 512, 8, 4, 1536),   # a GPU run, ~38 M non-embedding params
    "medium": (24, 1024, 16, 4, 3072),
}


@refuse_assignment
@dataclass(frozen=True)
class ModelConfig:
    """A whole model: vocabulary and depth around one ``AttentionConfig``.

    ``variant`` records the preset the attention came from (informational once
    ``attention`` is set). ``max_seq_len`` is the training context (RoPE scaling for
    extrapolation is measured relative to it).
    """

    vocab_size: int = field(metadata={"set": False, "help": "vocabulary size (from the data)"})
    n_layers: int = field(metadata={"help": "transformer blocks (default: the size preset's)"})
    attention: AttentionConfig = field(metadata={"set": False, "help": "the attention of every block"})
    ffn_dim: int = field(metadata={"help": "SwiGLU hidden width (default: the size preset's)"})
    variant: str = option("custom", set=False, help="the attention preset the model was built from")
    max_seq_len: int = option(2048, help="the training context (default: seq_len)")
    tie_embeddings: bool = option(True, help="the LM head shares the token embedding matrix")
    norm_eps: float = option(1e-6, gt=0, help="epsilon of the blocks' RMSNorms")
    init_std: float = option(0.02, gt=0, help="standard deviation of the initial weights")
    embed_std: float | None = option(None, gt=0, help="standard deviation of the initial token (and position) "
                                                "embeddings (default: init_std; 1.0 is GPT-2/BBM-style)")
    mlp: str = option("swiglu", choices=MLPS, help="the blocks' MLP: swiglu (Llama: three matrices, no biases), or "
                                                  "relu / gelu (OPT / GPT-2: up and down with biases)")
    norm: str = option("rms", choices=NORMS, help="the blocks' and final norm: rms (RMSNorm) or layer (LayerNorm with bias)")
    position_embedding: str = option("none", choices=POSITION_EMBEDDINGS, help="absolute positions added to the token embedding: none or "
                                                   "learned (GPT-2/OPT style, max_seq_len rows; set "
                                                   "rope.fraction=0 for no rotary positions)")
    bos_token_id: int | None = option(None, set=False, help="beginning-of-sequence token (from the data)")
    eos_token_id: int | None = option(None, set=False, help="end-of-sequence token (from the data)")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("vocab_size", "n_layers", "ffn_dim", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelConfig.{name}={getattr(self, name)!r} must be > 0")
        if not isinstance(self.attention, AttentionConfig):
            raise ConfigError(f"ModelConfig.attention must be an AttentionConfig, got {type(self.attention).__name__}")
        check_options(self)
        check_model_limits(self)  # each size field bounded before anything is allocated
        for name in ("bos_token_id", "eos_token_id"):
            tid = getattr(self, name)
            if tid is not None and not 0 <= tid < self.vocab_size:
                raise ConfigError(f"ModelConfig.{name}={tid} must be in [0, vocab_size={self.vocab_size})")

    @property
    def d_model(self) -> int:
        return self.attention.d_model

    @classmethod
    def from_preset(
        cls,
        size: str,
        variant: str = "baseline",
        *,
        vocab_size: int,
        max_seq_len: int = 256,
        qk_norm: bool = True,
        rope_theta: float = 10000.0,
        attention_fields: dict[str, Any] | None = None,
        **fields: Any,
    ) -> "ModelConfig":
        """A model of a named size (``micro``, ``tiny``, ``small``, ``base``, ``medium``)
        with the attention preset ``variant``."""
        if size not in SIZE_PRESETS:
            raise ConfigError(f"unknown size preset {size!r}; choose one of {', '.join(SIZE_PRESETS)}")
        n_layers, d_model, n_heads, n_kv, ffn = SIZE_PRESETS[size]
        attn_fields = {"qk_norm": qk_norm, "rope": RopeConfig(theta=rope_theta, original_max_len=max_seq_len)}
        attn_fields.update(attention_fields or {})
        # the shape may be changed too (a narrower or wider model of the preset's depth)
        width = attn_fields.pop("d_model", None) or d_model
        ffn, d_model = ffn * width // d_model, width  # the MLP keeps the preset's ratio
        if attn_fields.get("kv") == "mla":
            attn_fields.pop("qk_norm", None)
            n_kv = n_heads
        attention = get_variant(variant)(d_model, n_heads, n_kv, **attn_fields)
        return cls(vocab_size=vocab_size, n_layers=n_layers, attention=attention, ffn_dim=ffn,
                   variant=variant, max_seq_len=max_seq_len, **fields)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {"model_type": MODEL_TYPE, "architectures": ["GatedLM"], **d}

    def config_json(self) -> dict[str, Any]:
        """What a model directory's ``config.json`` holds: ``to_dict()`` and transformers'
        standard keys beside it (``models.standard``), which ``from_dict`` checks."""
        return {**self.to_dict(), **standard_keys(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], owner: str = "config.json") -> "ModelConfig":
        """The config of ``to_dict``'s dict; a standard key that disagrees with the fields is
        refused, naming it."""
        data, standard = split_standard_keys({k: v for k, v in data.items() if k not in _NOT_CONFIG_KEYS})
        if "attention" not in data:
            raise ConfigError("ModelConfig is missing the field 'attention'")
        data["attention"] = AttentionConfig.from_dict(data["attention"])
        cfg = build(cls, data)
        check_standard_keys(standard, cfg, owner)
        return cfg


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; gate and up run as one product where their weights
    lie stacked in one tensor (``layers.packing``)."""

    PACKED = (("gate_proj", "up_proj"),)  # the projections that may share one product

    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, ffn_dim, bias=False)
        self.up_proj = nn.Linear(d_model, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = packed_linear(x, (self.gate_proj, self.up_proj))
        gate, up = gate_up if gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return apply_linear(self.down_proj, F.silu(gate) * up)


class TwoLayerMLP(nn.Module):
    """``down(act(up(x)))`` with biases: the OPT (ReLU) and GPT-2 (GELU) MLP."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str):
        super().__init__()
        self.up_proj = nn.Linear(d_model, ffn_dim)
        self.down_proj = nn.Linear(ffn_dim, d_model)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


def make_mlp(cfg: ModelConfig) -> nn.Module:
    """The MLP ``cfg.mlp`` names (ffn_dim wide)."""
    if cfg.mlp == "swiglu":
        return SwiGLU(cfg.d_model, cfg.ffn_dim)
    return TwoLayerMLP(cfg.d_model, cfg.ffn_dim, cfg.mlp)


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The norm ``cfg.norm`` names: RMSNorm, or LayerNorm with a bias (GPT-2/OPT)."""
    if cfg.norm == "layer":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """Pre-norm transformer block; its output is the residual stream after the layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg.attention)
        self.mlp_norm = make_norm(cfg)
        self.mlp = make_mlp(cfg)

    def forward(self, x, positions=None, cache: KVCache | None = None, key_mask: torch.Tensor | None = None,
                rope: RopeTables | None = None):
        x = x + self.attn(self.attn_norm(x), positions=positions, cache=cache, key_mask=key_mask, rope=rope)
        return x + self.mlp(self.mlp_norm(x))


class GatedLM(nn.Module):
    """Decoder-only LM. ``forward(ids (B, T), positions=None, caches=None, *,
    attention_mask=None, inputs_embeds=None) -> logits (B, T, V)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_model_size(cfg, "GatedLM")  # the weights fit the memory the CPU has, before any is allocated
        self.cfg = cfg
        self.checkpoint_every = 0  # activation checkpointing: see set_activation_checkpointing
        self.gradient_checkpointing = False  # (what transformers reads to see whether it is on)
        self._checkpoint_fn: Any = None
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        if self.embed.weight.device.type != "meta":  # on the meta device there are no values to draw
            self.reset_parameters()

    @classmethod
    def expected_state(cls, cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """The state dict a model of ``cfg`` loads, as meta tensors (names, shapes and
        dtypes; nothing allocated), a tied LM head left out (it is the token embedding)."""
        with torch.device("meta"):
            return cls(cfg)._loaded_state()

    def _loaded_state(self) -> dict[str, torch.Tensor]:
        """The model's state dict as it is saved and loaded: a tied LM head left out."""
        state = self.state_dict()
        if self.cfg.tie_embeddings:
            state.pop("lm_head.weight")
        return state

    @classmethod
    def from_state(cls, cfg: ModelConfig, state: dict[str, torch.Tensor], source: Any,
                   dtype: torch.dtype | None = None) -> "GatedLM":
        """The model of ``cfg`` whose weights are the tensors of ``state`` themselves, not
        copies (a tensor in another dtype than ``dtype``, float32 by default, or not
        contiguous, is converted): it is built on the meta device, so the weights exist once in memory,
        never twice. ``state`` must match the model's state dict exactly (names and shapes;
        :func:`check_state_dict` names the first that does not, with ``source``); a tied LM
        head may be left out. The buffers (RoPE frequencies) are made on the weights' device."""
        with torch.device("meta"):
            model = cls(cfg)
        expected = model._loaded_state()
        if cfg.tie_embeddings:
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        check_state_dict(state, expected, source)
        model.load_state_dict({k: v.to(dtype or expected[k].dtype).contiguous() for k, v in state.items()},
                              strict=False, assign=True)
        if cfg.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        device = model.embed.weight.device
        for module in model.modules():
            if isinstance(module, Rotary):
                module.make_buffers(device)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:  # a tensor the model holds that is neither loaded nor made: never leave it unset
            raise GatedAttnError(f"{source}: {left[0]!r} of the model is neither in the weights nor computed")
        return model

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) for matrices, Normal(0, embed_std or init_std) for the
        embeddings (a tied LM head shares the token embedding's), residual-output
        projections scaled by 1/sqrt(2 n_layers); norms at one; biases and static gates at
        zero; sinks at ``attention.sink_init`` (0 unless set)."""
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        embed_std = self.cfg.embed_std if self.cfg.embed_std is not None else self.cfg.init_std
        owned: set[int] = set()  # modules inside a gate: the gate initialises them
        for name, module in self.named_modules():
            if id(module) in owned:
                continue
            if isinstance(module, Gate):
                module.reset_parameters(self.cfg.init_std)
                owned.update(id(m) for m in module.modules())
            elif isinstance(module, nn.Embedding) or (isinstance(module, nn.Linear) and name == "lm_head"
                                                       and self.cfg.tie_embeddings):
                # a tied head is the token embedding, drawn again: the extra draw keeps every
                # later weight's place in the random stream (a seed gives the same model)
                nn.init.normal_(module.weight, 0.0, embed_std)
            elif isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("o_proj", "down_proj")) else self.cfg.init_std
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
                if module.weight is not None:
                    nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Attention) and module.sink is not None:
                nn.init.constant_(module.sink, module.cfg.sink_init)

    def _check_input(self, ids: torch.Tensor | None, caches: list[KVCache] | None,
                     inputs_embeds: torch.Tensor | None = None) -> tuple[int, int]:
        """Refuse, naming the problem, token ids that are not a (batch, time) integer tensor
        within the vocabulary, embeddings that are not (batch, time, d_model) floats, and
        caches that do not fit them. Returns (batch, time)."""
        if (ids is None) == (inputs_embeds is None):
            raise GatedAttnError("GatedLM takes token ids or inputs_embeds, exactly one of them")
        B, T = self._check_ids(ids) if inputs_embeds is None else self._check_embeds(inputs_embeds)
        if caches is not None:
            if len(caches) != len(self.blocks):
                raise GatedAttnError(f"GatedLM got {len(caches)} caches for {len(self.blocks)} layers; use model.new_cache()")
            batch = getattr(caches[0], "batch_size", None)  # (adapters of other cache types: unchecked)
            if batch is not None and batch != B:
                raise GatedAttnError(f"the KV cache holds a batch of {batch}, the input a batch of {B}; "
                                     f"start a new cache (model.new_cache())")
        return B, T

    def _check_ids(self, ids: torch.Tensor) -> tuple[int, int]:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            what = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise GatedAttnError(f"GatedLM input must be integer token ids (torch.int64 or torch.int32) of shape "
                                 f"(batch, time), got {what}")
        if not torch.compiler.is_compiling() and ids.device.type == "cpu" and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise GatedAttnError(f"GatedLM input holds token id {hi if hi >= self.cfg.vocab_size else lo}, "
                                     f"outside the vocabulary [0, {self.cfg.vocab_size})")
        return ids.shape[0], ids.shape[1]

    def _check_embeds(self, e: torch.Tensor) -> tuple[int, int]:
        if not isinstance(e, torch.Tensor) or e.dim() != 3 or not e.dtype.is_floating_point \
                or e.shape[-1] != self.cfg.d_model:
            what = f"{tuple(e.shape)} {e.dtype}" if isinstance(e, torch.Tensor) else type(e).__name__
            raise GatedAttnError(f"GatedLM inputs_embeds must be floats of shape (batch, time, "
                                 f"d_model={self.cfg.d_model}), got {what}")
        return e.shape[0], e.shape[1]

    def _key_mask(self, attention_mask: torch.Tensor | None, batch: int, seen: int, new: int) -> torch.Tensor | None:
        """The boolean key mask (B, seen + new) of a padded batch, or None when nothing is
        padded (no mask, or one without zeros)."""
        if attention_mask is None:
            return None
        m = attention_mask
        if not isinstance(m, torch.Tensor) or m.dim() != 2:
            what = f"a {m.dim()}-D tensor" if isinstance(m, torch.Tensor) else type(m).__name__
            raise GatedAttnError(f"attention_mask must be a 2-D padding mask (batch, past + new tokens) of 1 for "
                                 f"tokens and 0 for padding, got {what} (custom attention patterns are not supported)")
        if tuple(m.shape) != (batch, seen + new):
            raise GatedAttnError(f"attention_mask has shape {tuple(m.shape)}; the input needs (batch, past + new "
                                 f"tokens) = ({batch}, {seen + new})")
        if torch.compiler.is_compiling():
            return m.bool()
        if m.dtype != torch.bool and bool(((m != 0) & (m != 1)).any()):
            raise GatedAttnError("attention_mask must hold only 1 (token) and 0 (padding)")
        return None if bool(m.all()) else m.bool()

    def _absolute_positions(self, ids: torch.Tensor, positions: torch.Tensor | None,
                            caches: list[KVCache] | None) -> torch.Tensor:
        """Positions (T,) or (B, T) for the learned position table; beyond it is an error."""
        if positions is None:
            offset = caches[0].length if caches is not None else 0
            positions = torch.arange(offset, offset + ids.shape[1], device=ids.device)
        if not torch.compiler.is_compiling() and positions.numel() and int(positions.max()) >= self.cfg.max_seq_len:
            raise GatedAttnError(
                f"position {int(positions.max())} is beyond the learned position table (ModelConfig.max_seq_len="
                f"{self.cfg.max_seq_len}); a model with position_embedding='learned' cannot extrapolate")
        return positions

    def new_cache(self, capacity: int | None = None) -> list[KVCache]:
        """One empty ``KVCache`` per layer; ``capacity`` (the positions a decoding will
        reach) lets each write its steps in place instead of growing by concatenation."""
        return [KVCache(capacity) for _ in self.blocks]

    def forward(self, ids: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                caches: list[KVCache] | None = None, *, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) of token ``ids`` (B, T) or of ``inputs_embeds`` (B, T, d_model);
        with ``targets`` (B, T) the mean next-token cross-entropy instead (targets of
        ``ignore_index`` -100 left out), the LM head and the loss fused
        (:func:`gatedattn.ops.linear_cross_entropy`: no (B, T, V) float32 logits).
        ``attention_mask`` (B, past + T): 1 for tokens, 0 for padding; ``positions`` (T,) or
        (B, T) default to ``cumsum(attention_mask) - 1`` for a padded batch, else to
        ``past + arange(T)``; ``caches`` one ``KVCache`` per layer (``new_cache()``);
        ``logits_to_keep`` N > 0: the logits of the last N positions only (B, N, V), as in
        transformers (decoding reads the last position's)."""
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise GatedAttnError(f"logits_to_keep={logits_to_keep!r} must be an int >= 0 (0: every position)")
        B, T = self._check_input(ids, caches, inputs_embeds)
        seen = caches[0].length if caches is not None else 0
        key_mask = self._key_mask(attention_mask, B, seen, T)
        positions = self._default_positions(positions, key_mask, seen, T,
                                            (ids if ids is not None else inputs_embeds).device)
        rope = RopeTables(positions)  # cos/sin once for every layer
        x = self.embed(ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed(self._absolute_positions(x[..., 0], positions, caches))
        every = self.checkpoint_every if (self.training and torch.is_grad_enabled() and caches is None) else 0
        for i, block in enumerate(self.blocks):
            if every and i % every == 0:
                x = self._checkpoint_fn(block, x, positions, None, key_mask, rope)
            else:
                x = block(x, positions=positions, cache=caches[i] if caches is not None else None, key_mask=key_mask,
                          rope=rope)
        if targets is not None:
            return self.head_loss(self.norm(x), targets)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return apply_linear(self.lm_head, self.norm(x))

    @staticmethod
    def _default_positions(positions: torch.Tensor | None, key_mask: torch.Tensor | None, seen: int, new: int,
                           device: torch.device) -> torch.Tensor:
        """``positions`` as (1 or B, T): as given, else each row's count of real tokens before
        it (a padded batch), else ``seen + arange(T)``."""
        if positions is None and key_mask is not None:
            positions = (key_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -new:]
        if positions is None:
            positions = torch.arange(seen, seen + new, device=device)
        return positions[None] if positions.dim() == 1 else positions  # (1, T)

    def head_loss(self, h_BTC: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of the head's logits of the final hidden states ``h_BTC`` (after the
        norm) over ``targets`` (B, T) (``reduction`` mean, sum or none (B*T,)): fused where the
        head is a plain bias-free ``nn.Linear`` no hook watches, else through the logits."""
        if not isinstance(targets, torch.Tensor) or targets.shape != h_BTC.shape[:2] or targets.dtype.is_floating_point:
            what = f"{tuple(targets.shape)} {targets.dtype}" if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise GatedAttnError(f"targets must be integer token ids of the input's shape {tuple(h_BTC.shape[:2])}, "
                                 f"got {what}")
        head = self.lm_head
        if type(head) is nn.Linear and head.bias is None and not (head._forward_hooks or head._forward_pre_hooks):
            return linear_cross_entropy(h_BTC.flatten(0, 1), head.weight, targets.flatten(), reduction=reduction)
        return F.cross_entropy(head(h_BTC).float().flatten(0, 1), targets.flatten(), reduction=reduction)

    # ------------------------------------------------------------------ transformers-style hooks
    def set_activation_checkpointing(self, every: int, checkpoint_fn: Any = None) -> None:
        """Recompute the activations of blocks 0, every, 2*every, ... in backward instead of
        keeping them (``every`` 1: every block; 0: off). Applies in training mode with
        gradients on and no KV cache. ``checkpoint_fn(block, *args)`` defaults to
        ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise GatedAttnError(f"activation checkpointing every={every!r} must be an int >= 0 (0 = off)")
        self.checkpoint_every = every
        self.gradient_checkpointing = every > 0
        self._checkpoint_fn = checkpoint_fn or functools.partial(checkpoint, use_reentrant=False)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, embedding: nn.Embedding) -> None:
        """Use ``embedding`` as the token embedding; ``cfg.vocab_size`` follows its rows and
        a tied LM head shares its weight."""
        if not isinstance(embedding, nn.Embedding) or embedding.embedding_dim != self.cfg.d_model:
            raise GatedAttnError(f"the input embedding must be an nn.Embedding of width d_model={self.cfg.d_model}, "
                                 f"got {embedding!r}")
        self.embed = embedding
        self.cfg = self.cfg.replace(vocab_size=embedding.num_embeddings)
        if self.cfg.tie_embeddings:
            self.lm_head.weight = embedding.weight
            self.lm_head.out_features = embedding.num_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, head: nn.Linear) -> None:
        if not isinstance(head, nn.Linear) or head.in_features != self.cfg.d_model:
            raise GatedAttnError(f"the output embedding must be an nn.Linear from d_model={self.cfg.d_model}, "
                                 f"got {head!r}")
        self.lm_head = head

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of a (B, T+1) token batch (the head and the loss
        fused, as ``forward(ids, targets=...)``)."""
        return self(batch[:, :-1], targets=batch[:, 1:])

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True, eos_token_id: int | None = None,
                 attention_mask: torch.Tensor | None = None, compile: bool | str = "auto") -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``ids`` (B, T). ``temperature`` 0 is greedy.
        With ``use_cache`` each step runs one token through the KV cache.
        ``attention_mask`` (B, T) marks left padding with 0 (each row then continues from
        its own last token; every generated token is real). ``compile`` True runs each
        token through one step compiled by inductor over a static cache (``models.decode``;
        a backend's name, e.g. ``"aot_eager"``, compiles with that backend), False
        eagerly; ``"auto"`` compiles where the new tokens reach
        ``decode.AUTO_MIN_TOKENS``, where the compile pays for itself."""
        check_generate_args(ids, max_new_tokens, temperature, top_k)
        check_compile(compile)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        if attention_mask is not None:
            self._key_mask(attention_mask, ids.shape[0], 0, ids.shape[1])  # its shape and values
            if ids.shape[1] and not bool(attention_mask[:, -1].bool().all()):
                raise GatedAttnError("generate needs left padding: attention_mask has a 0 in its last column")
        backend = compiles(compile, ids.shape[0], max_new_tokens, use_cache)
        self._check_generate_size(ids, max_new_tokens, static_capacity(ids.shape[1] + max_new_tokens) if backend else
                                  ids.shape[1] + max_new_tokens, use_cache, generator)
        was_training = self.training
        self.eval()
        try:
            # under autocast the weights are cast once and swapped in once, not at every step
            with FrozenCasts(self).applied() as model:
                steps = (StaticSteps(model, ids, max_new_tokens, attention_mask, backend) if backend else
                         EagerSteps(model, ids, max_new_tokens, use_cache, attention_mask))
                return decode_tokens(steps, ids, max_new_tokens, temperature, top_k, generator, eos_token_id)
        finally:
            self.train(was_training)

    def _check_generate_size(self, ids: torch.Tensor, max_new_tokens: int, cached: int, use_cache: bool,
                             generator: torch.Generator | None) -> None:
        """The KV cache of ``cached`` positions (and the ids) fits the device's memory, and a
        ``generator`` is on the device the sampling runs on; else one line naming them."""
        weight = self.embed.weight
        parts = {"the ids": 8 * ids.shape[0] * (ids.shape[1] + max_new_tokens)}
        if use_cache:
            parts["the KV cache"] = ids.shape[0] * cached * kv_cache_bytes_per_token(self.cfg, weight.element_size())
        check_memory("generate", parts, {"max_new_tokens": max_new_tokens, "the batch": ids.shape[0]}, weight.device)
        if generator is not None and torch.device(generator.device).type != weight.device.type:
            raise GatedAttnError(f"generate: generator is on {generator.device}, the model on {weight.device}; give a "
                                 f"torch.Generator(device={str(weight.device)!r})")

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, directory: str | Path,
                        extra: Callable[[Path], dict[str, Any]] | None = None,
                        max_shard_bytes: int | None = None, *, save_code: bool = True,
                        self_contained: bool | None = None) -> Path:
        """Write ``config.json``, ``generation_config.json``, ``model.safetensors`` (no
        pickle) and, with ``save_code`` (the default), the modelling code and its ``auto_map``
        (``models.code``: the directory then loads with ``trust_remote_code=True`` where
        gatedattn is not installed) into a directory written beside ``directory`` and
        renamed into place, so an existing model there survives any failure whole (its other
        files, e.g. a tokenizer, are carried over). ``extra(tmp)``, if given, writes more
        files into that directory before it is renamed and returns entries for
        ``config.json``. Weights larger than ``max_shard_bytes`` are written as shards with
        an index (``models.shards``). ``self_contained`` is the old name of ``save_code``."""
        if self_contained is not None:
            warnings.warn("GatedLM.save_pretrained(self_contained=...) is now save_code=... (and the modelling "
                          "code is written by default)", DeprecationWarning, stacklevel=2)
            save_code = self_contained
        if not isinstance(save_code, bool):
            raise ConfigError(f"GatedLM.save_pretrained: save_code must be True or False, got {save_code!r}")
        directory = Path(directory)
        state = self._loaded_state()
        config = {**self.cfg.config_json(), "dtype": str(self.embed.weight.dtype).removeprefix("torch.")}
        with atomic_model_dir(directory) as tmp:  # an existing model survives any failure whole
            if save_code:
                config["auto_map"] = write_code(tmp)
            if extra is not None:
                config.update(extra(tmp))
            write_weights(tmp, state, max_shard_bytes)
            record_checksum(atomic_write_json(tmp / CONFIG_FILE, config))
            if not (tmp / GENERATION_CONFIG_FILE).is_file():  # the HF wrapper writes its own
                record_checksum(atomic_write_json(tmp / GENERATION_CONFIG_FILE, self.generation_defaults()))
        return directory

    def generation_defaults(self) -> dict[str, Any]:
        """What ``generation_config.json`` holds (``generation_defaults(cfg)``)."""
        return generation_defaults(self.cfg)

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str | torch.device = "cpu") -> "GatedLM":
        """Load a directory written by ``save_pretrained``. Every tensor must be present
        with the right shape; anything else is an error naming the tensor."""
        directory = Path(directory)
        map_location = check_map_location(map_location)
        cfg = load_model_config(directory)
        model = cls.from_state(cfg, read_weights(directory, map_location), directory / WEIGHTS_FILE)
        return model.to(map_location)


def generation_defaults(cfg: ModelConfig) -> dict[str, Any]:
    """What ``generation_config.json`` holds (``transformers.GenerationConfig`` reads it): the
    model's BOS and EOS, and the EOS as padding (Llama's convention) where it has no other."""
    ids = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.eos_token_id}
    return {k: v for k, v in ids.items() if v is not None}


def load_model_config(directory: Path) -> ModelConfig:
    recover_missing(directory)  # a killed replace's previous copy is put back first
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise GatedAttnError(f"{directory} is not a model directory: {CONFIG_FILE} is missing")
    verify_file(path)
    verify_dir(directory, skip=(WEIGHTS_FILE,))  # every file its manifest lists (the weights are hashed as read)
    data = read_json_object(path)
    model_type = data.get("model_type")
    if model_type != MODEL_TYPE:
        raise GatedAttnError(
            f"{path} has model_type={model_type!r}, not {MODEL_TYPE!r}; import other architectures with "
            f"gatedattn.hf.load_model (or `gatedattn convert --from DIR --to DIR`)"
        )
    return ModelConfig.from_dict(data, str(path))


def check_state_dict(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], source: Any) -> None:
    """Raise naming the first missing, unexpected or mis-shaped tensor."""
    missing = sorted(set(expected) - set(state))
    if missing:
        raise GatedAttnError(f"{source}: tensor {missing[0]!r} is missing ({len(missing)} missing in all)")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise GatedAttnError(f"{source}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise GatedAttnError(
                f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, the config needs {tuple(expected[name].shape)}"
            )


def __getattr__(name: str) -> Any:
    """``read_safetensors`` moved to :mod:`gatedattn.models.shards`; the old path warns for a release."""
    if name == "read_safetensors":
        warnings.warn("gatedattn.models.lm.read_safetensors moved to gatedattn.models.shards.read_safetensors "
                      "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
        return _moved_read_safetensors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
