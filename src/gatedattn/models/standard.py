"""transformers' standard ``config.json`` keys of a ``ModelConfig``.

Every saved model's ``config.json`` holds, beside the model's own fields, the names a
Llama or Qwen config uses (``hidden_size``, ``num_attention_heads``, ``rope_parameters``,
...), so that tools which read the JSON without importing anything (memory estimators,
model-card generators, evaluation harnesses' size reports, serving engines' loaders) find
them. The model's own fields stay the source of truth: on load, a standard key whose value
disagrees with them is refused, naming the key; a file without them (written before they
were) loads as before.
"""

from __future__ import annotations

from typing import Any

from gatedattn.infra.errors import ConfigError

# the MLP -> transformers' ``hidden_act`` (SwiGLU's gate is SiLU, as in Llama)
HIDDEN_ACTS = {"swiglu": "silu", "relu": "relu", "gelu": "gelu"}
# RopeConfig.scaling -> transformers' rope_type ("ntk" is a static NTK-aware base change,
# which transformers has no name for; its "dynamic" changes the base with the length)
ROPE_TYPES = {"none": "default", "linear": "linear", "ntk": "ntk", "yarn": "yarn"}


def rope_parameters(rope: Any) -> dict[str, Any]:
    """transformers' ``rope_parameters`` dict of a ``RopeConfig``."""
    params: dict[str, Any] = {"rope_type": ROPE_TYPES[rope.scaling], "rope_theta": rope.theta}
    if rope.scaling != "none":
        params["factor"] = rope.factor
        params["original_max_position_embeddings"] = rope.original_max_len
    if rope.scaling == "yarn":
        params.update(beta_fast=rope.beta_fast, beta_slow=rope.beta_slow)
    if rope.fraction != 1.0:
        params["partial_rotary_factor"] = rope.fraction
    return params


# standard key -> (the model's own field it mirrors, how it is read from a ModelConfig)
_KEYS: dict[str, tuple[str, Any]] = {
    "hidden_size": ("attention.d_model", lambda c: c.attention.d_model),
    "num_attention_heads": ("attention.n_heads", lambda c: c.attention.n_heads),
    "num_key_value_heads": ("attention.n_kv_heads", lambda c: c.attention.n_kv_heads),
    "head_dim": ("attention.head_dim", lambda c: c.attention.head_dim),
    "num_hidden_layers": ("n_layers", lambda c: c.n_layers),
    "intermediate_size": ("ffn_dim", lambda c: c.ffn_dim),
    "max_position_embeddings": ("max_seq_len", lambda c: c.max_seq_len),
    "hidden_act": ("mlp", lambda c: HIDDEN_ACTS[c.mlp]),
    "rope_theta": ("attention.rope.theta", lambda c: c.attention.rope.theta),
    "rope_parameters": ("attention.rope", lambda c: rope_parameters(c.attention.rope)),
    "tie_word_embeddings": ("tie_embeddings", lambda c: c.tie_embeddings),
    "rms_norm_eps": ("norm_eps", lambda c: c.norm_eps),
    "layer_norm_eps": ("norm_eps", lambda c: c.norm_eps),
}
# written, but mirroring no field of the model: the padding token (the EOS, as in
# generation_config.json: Llama's convention)
INFORMATIONAL = ("pad_token_id",)
STANDARD_KEYS = (*_KEYS, *INFORMATIONAL)


def standard_keys(cfg: Any) -> dict[str, Any]:
    """The standard keys of a ``ModelConfig`` (``rms_norm_eps`` or ``layer_norm_eps`` by its norm)."""
    skip = "layer_norm_eps" if cfg.norm == "rms" else "rms_norm_eps"
    keys = {name: read(cfg) for name, (_, read) in _KEYS.items() if name != skip}
    keys["pad_token_id"] = cfg.eos_token_id
    return keys


def split_standard_keys(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` without its standard keys, and those keys."""
    own = {k: v for k, v in data.items() if k not in STANDARD_KEYS}
    return own, {k: v for k, v in data.items() if k in STANDARD_KEYS}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def check_standard_keys(given: dict[str, Any], cfg: Any, owner: str = "config.json") -> None:
    """Refuse a standard key in ``given`` that disagrees with the ``ModelConfig`` ``cfg``."""
    for name, value in given.items():
        if name in INFORMATIONAL:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < cfg.vocab_size):
                raise ConfigError(f"{owner}: {name}={value!r} must be null or a token id in "
                                  f"[0, vocab_size={cfg.vocab_size})")
            continue
        field, read = _KEYS[name]
        expected = read(cfg)
        if not _same(value, expected):
            raise ConfigError(f"{owner}: {name}={value!r} disagrees with the model's own field {field} "
                              f"(which gives {expected!r}); the model's fields are the source of truth: "
                              f"correct {name} or remove it")
