"""Sizes and limits checked before anything is allocated or created.

A model or batch whose size is a typo (``micro_batch=1e12``, ``n_layers=10**9``, a
``config.json`` with ``vocab_size: 10**12``) would otherwise end in an allocation error
deep inside PyTorch, or in hours of swapping. :func:`model_params` counts a model's
parameters from its config alone (a lower bound: the embedding, a learned position
table, the q/k/v/o projections and the MLP, no gates or norms), and the checks
refuse a model or a training run whose lower-bound memory exceeds what the device can
give (the memory available on the CPU, the total on a GPU), naming the sizes.
:func:`check_model_limits` bounds each size field first (far beyond any real model), so
an absurd layer count is refused at once, not after minutes of building layers.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from gatedattn.infra.errors import ConfigError, GatedAttnError

GB = 1 << 30


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def model_params(cfg: Any) -> int:
    """A lower bound on the parameter count of the ``ModelConfig`` ``cfg`` (Python integers: no overflow)."""
    a = cfg.attention
    d, heads = _int(a.d_model), _int(a.n_heads)
    kv = _int(a.n_kv_heads) or heads
    hd = _int(a.head_dim) or (d // heads if heads else 0)
    attn = 2 * d * heads * hd + 2 * d * kv * hd
    mlp = (3 if getattr(cfg, "mlp", "swiglu") == "swiglu" else 2) * d * _int(cfg.ffn_dim)
    embed = _int(cfg.vocab_size) * d * (1 if cfg.tie_embeddings else 2)
    positions = _int(cfg.max_seq_len) * d if getattr(cfg, "position_embedding", "none") == "learned" else 0
    return embed + positions + _int(cfg.n_layers) * (attn + mlp)


# Bounds on a model's size fields, far beyond any real model (the largest vocabularies are
# about 2**18, models about 2**7 layers, heads 2**8, widths 2**15): past them a size is a typo.
MODEL_LIMITS = {"vocab_size": 1 << 24, "n_layers": 1 << 12, "d_model": 1 << 18, "ffn_dim": 1 << 20,
                "n_heads": 1 << 14, "n_kv_heads": 1 << 14, "head_dim": 1 << 14}
MAX_LEARNED_POSITIONS = 1 << 24  # rows of a learned position table (RoPE allocates nothing per position)


def check_limit(owner: str, field: str, value: Any, limit: int) -> None:
    """A ``ConfigError`` naming ``owner.field`` unless ``value`` (an integer, or None) is at most ``limit``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > limit:
        raise ConfigError(f"{owner}.{field}={value} is too large; allowed: 1 to {limit:,} "
                          f"(2**{limit.bit_length() - 1})")


def check_flag_range(flag: str, value: Any, low: int, high: int) -> None:
    """A command-line size ``value`` (None: not given) is an integer in ``[low, high]``, or a
    ``GatedAttnError`` naming ``flag``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GatedAttnError(f"{flag} {value!r} must be an integer in [{low:,}, {high:,}]")


def check_attention_limits(cfg: Any) -> None:
    """Each size field of the ``AttentionConfig`` ``cfg`` within :data:`MODEL_LIMITS`:
    checked when the config is made, before any layer is allocated."""
    for name in ("d_model", "n_heads", "n_kv_heads", "head_dim"):
        check_limit("AttentionConfig", name, getattr(cfg, name, None), MODEL_LIMITS[name])


def attention_params(cfg: Any) -> int:
    """A lower bound on the parameter count of one attention layer of the ``AttentionConfig``
    ``cfg`` (its q, k, v and output projections; Python integers: no overflow)."""
    d, heads = _int(cfg.d_model), _int(cfg.n_heads)
    kv, hd = _int(cfg.n_kv_heads) or heads, _int(cfg.head_dim)
    return 2 * d * heads * hd + 2 * d * kv * hd


def check_layer_size(cfg: Any, source: Any, device: Any = "cpu", bytes_per_param: int = 4) -> None:
    """Refuse an attention layer whose weights alone (float32) exceed the device's memory,
    before any is allocated."""
    _check_weights_fit(attention_params(cfg) * bytes_per_param, device,
                       f"{source}: the layer (d_model={cfg.d_model}, n_heads={cfg.n_heads}, "
                       f"n_kv_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim})")


def check_model_limits(cfg: Any) -> None:
    """Each size field of the ``ModelConfig`` ``cfg`` within :data:`MODEL_LIMITS` (and a
    learned position table within :data:`MAX_LEARNED_POSITIONS` rows): checked when a config
    is made or loaded, before anything is allocated."""
    a = cfg.attention
    for name in ("vocab_size", "n_layers", "ffn_dim"):
        check_limit("ModelConfig", name, getattr(cfg, name), MODEL_LIMITS[name])
    check_attention_limits(a)
    if getattr(cfg, "position_embedding", "none") == "learned":
        check_limit("ModelConfig", "max_seq_len", cfg.max_seq_len, MAX_LEARNED_POSITIONS)


def available_memory() -> int | None:
    """The memory the CPU can give now without swapping (``MemAvailable``), where Linux tells."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_memory(device: Any = "cpu") -> int:
    """Memory of ``device`` in bytes: the total of a GPU, the available memory of the CPU
    (physical RAM where that is not known)."""
    import torch  # lazy: heavy (torch)

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    available = available_memory()
    if available is not None:
        return available
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux/macOS
        return 1 << 62


def _fmt(n: int) -> str:
    return f"{n / GB:,.1f} GB" if n < 1 << 70 else f"about 2^{n.bit_length() - 1} bytes"


def check_model_size(cfg: Any, source: Any, device: Any = "cpu", bytes_per_param: int = 4) -> None:
    """Refuse a model whose size fields pass their bounds (:func:`check_model_limits`) or
    whose weights alone (float32) exceed the device's memory."""
    check_model_limits(cfg)
    _check_weights_fit(model_params(cfg) * bytes_per_param, device,
                       f"{source}: the model (vocab_size={cfg.vocab_size}, n_layers={cfg.n_layers}, "
                       f"d_model={cfg.attention.d_model}, ffn_dim={cfg.ffn_dim}, n_heads={cfg.attention.n_heads}, "
                       f"head_dim={cfg.attention.head_dim}, max_seq_len={cfg.max_seq_len} with "
                       f"{getattr(cfg, 'position_embedding', 'none')} positions)")


def _check_weights_fit(need: int, device: Any, what: str) -> None:
    """A ``GatedAttnError`` where ``need`` bytes of weights exceed ``device``'s memory,
    ``what`` naming the sizes that asked for them."""
    have = device_memory(device)
    if need > have:
        raise GatedAttnError(f"{what} needs at least {_fmt(need)} for its weights; this {str(device)} has "
                             f"{_fmt(have)} available: a size is wrong")


def training_bytes(cfg: Any, model_cfg: Any, world_size: int = 1) -> dict[str, int]:
    """Lower bounds (bytes) on what one training process holds: weights, gradients and
    one optimizer moment (12 bytes a parameter); the logits of a micro-batch and their
    gradient; the layers' inputs kept for backward; the step's global batch offsets."""
    rows, seq = _int(cfg.micro_batch), _int(cfg.seq_len)
    d, layers, vocab = _int(model_cfg.attention.d_model), _int(model_cfg.n_layers), _int(model_cfg.vocab_size)
    return {
        "parameters": 12 * model_params(model_cfg),
        "activations": rows * seq * (8 * vocab + 4 * d * max(layers, 1)),
        "batch": 8 * _int(cfg.micro_batch) * _int(cfg.grad_accum) * max(world_size, 1) + 8 * rows * (seq + 1),
    }


C_INT_MAX = (1 << 63) - 1  # what torch, NumPy and the standard library take as a size, count or seed


def check_c_ints(obj: Any) -> None:
    """Every integer field of the dataclass ``obj`` below 2**63 (a seed of 2**64 or a window of
    1e20 would overflow inside torch or the standard library, after minutes of work)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > C_INT_MAX:
            raise GatedAttnError(f"{type(obj).__name__}.{f.name}={value} is too large; allowed: integers below 2**63")


def check_training_size(cfg: Any, model_cfg: Any, device: Any = "cpu", world_size: int = 1) -> None:
    """Refuse a training run whose lower-bound memory exceeds the device's total memory,
    or an integer setting beyond 2**63, before the model or a batch is allocated; the
    message names the sizes."""
    check_c_ints(cfg)
    parts = training_bytes(cfg, model_cfg, world_size)
    need, have = sum(parts.values()), device_memory(device)
    if need > have:
        biggest = max(parts, key=parts.get)
        sizes = (f"micro_batch={cfg.micro_batch}, grad_accum={cfg.grad_accum}, seq_len={cfg.seq_len}, "
                 f"n_layers={model_cfg.n_layers}, d_model={model_cfg.attention.d_model}, "
                 f"ffn_dim={model_cfg.ffn_dim}, vocab_size={model_cfg.vocab_size}")
        raise GatedAttnError(f"this run needs at least {_fmt(need)} ({biggest} {_fmt(parts[biggest])}); this "
                             f"{str(device)} has {_fmt(have)}: lower the sizes ({sizes})")


MAX_BUDGET_MINUTES = 7 * 24 * 60  # a week: beyond it a budget is a typo (and inf/nan never end)


def check_budget_minutes(minutes: Any, flag: str = "--budget-minutes") -> None:
    """A wall-clock budget is a finite number of minutes in (0, a week]; checked before
    any output directory is created."""
    if minutes is None:
        return
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not math.isfinite(minutes) \
            or not 0 < minutes <= MAX_BUDGET_MINUTES:
        raise GatedAttnError(f"{flag} {minutes!r} must be a finite number of minutes in (0, {MAX_BUDGET_MINUTES}] "
                             f"(a week)")


def kv_cache_bytes_per_token(model_cfg: Any, bytes_per_value: int = 4) -> int:
    """What every layer's KV cache holds per cached position (one sequence): keys and
    values of each KV head (GQA/MHA), or the latent and the shared RoPE key (MLA)."""
    a = model_cfg.attention
    heads = _int(a.n_heads)
    if getattr(a, "kv", None) == "mla" and getattr(a, "mla", None) is not None:
        per_layer = _int(a.mla.kv_rank) + _int(a.mla.rope_dim)
    else:
        kv = _int(a.n_kv_heads) or heads
        hd = _int(a.head_dim) or (_int(a.d_model) // heads if heads else 0)
        per_layer = 2 * kv * hd
    return _int(model_cfg.n_layers) * per_layer * bytes_per_value


def forward_bytes(model_cfg: Any, rows: int, seq_len: int, *, attention_probs: bool = False) -> dict[str, int]:
    """Lower bounds (bytes, float32) on what one forward pass without gradients holds for
    ``rows`` sequences of ``seq_len`` positions: the weights, the logits and the
    log-probabilities of the loss (rows x T x vocab x 4 each), one layer's activations
    (the residual stream, its normed copy, the MLP's hidden units) and, with
    ``attention_probs`` (an analysis that reads them), one layer's attention
    probabilities and scores (rows x heads x T x T x 4 each)."""
    rows, seq = _int(rows), _int(seq_len)
    a = model_cfg.attention
    parts = {
        "weights": 4 * model_params(model_cfg),
        "logits": 2 * 4 * rows * seq * _int(model_cfg.vocab_size),
        "activations": 4 * rows * seq * (2 * _int(a.d_model) + _int(model_cfg.ffn_dim)),
    }
    if attention_probs:
        parts["attention probabilities"] = 2 * 4 * rows * _int(a.n_heads) * seq * seq
    return parts


def _option_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{flag} {value}" for flag, value in options.items())


def _size(n: int) -> str:
    """Bytes in GB, or in MB / KB below one GB / MB (a small device or a small part)."""
    if n >= GB:
        return _fmt(n)
    return f"{n / (1 << 20):,.1f} MB" if n >= 1 << 20 else f"{n / 1024:,.1f} KB"


def check_memory(what: str, parts: dict[str, int], options: dict[str, Any], device: Any = "cpu") -> None:
    """Refuse, before any work, a command whose lower-bound allocation ``parts`` (name ->
    bytes, from its size ``options``: flag -> value) exceeds the memory of ``device``; the
    message names the options, the estimate and its parts (largest first) and the limit."""
    need, have = sum(parts.values()), device_memory(device)
    if need > have:
        listed = ", ".join(f"{name} {_size(n)}" for name, n in sorted(parts.items(), key=lambda p: -p[1]) if n)
        raise GatedAttnError(f"{_option_text(options)}: {what} needs at least {_size(need)} ({listed}); this "
                             f"{str(device)} has {_size(have)} available: lower {' or '.join(options)}")
