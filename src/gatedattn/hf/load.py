"""Import local checkpoint directories as ``GatedLM`` models.

``load_model(dir)`` reads ``config.json`` and picks an importer from ``IMPORTERS`` by
its ``model_type``:

* ``gatedattn`` -- a directory written by ``GatedLM.save_pretrained``;
* ``qwen3``, ``llama``, ``qwen2`` -- HuggingFace ``*ForCausalLM`` checkpoints, loaded
  as ``baseline`` models with the same logits as transformers;
* ``qwen3`` with ``elementwise_attn_output_gate`` / ``headwise_attn_output_gate`` --
  the official gated-attention checkpoints (``q_proj`` packs the gate in the
  KV-grouped layout, see ``gatedattn.hf.layouts``), loaded as ``gated`` /
  ``gated-headwise``;
* ``qwen3_next`` whose every layer is full attention with a dense MLP (what
  ``export_hf`` writes for a ``gated`` model) -- loaded as ``gated``; hybrid
  linear-attention and MoE models are refused naming the layer.

A ``.gguf`` file (or a directory holding exactly one and no ``config.json``) of a llama,
qwen2 or qwen3 model is read by ``gatedattn.hf.gguf``: transformers' GGUF loader gives the
config dict and the dequantized tensors, which go through the same importers and
tensor mapping as a directory.

An importer maps every config field that changes the computation or refuses the
checkpoint with a ``GatedAttnError`` naming the field; every tensor must be present
with the right shape and every tensor in the files must be used. Nothing is loaded
partially or approximately.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from gatedattn.infra.device import model_device
from gatedattn.infra.errors import GatedAttnError
from gatedattn.hf import importers
from gatedattn.hf.checkpoint import read_config
from gatedattn.hf.gguf import gguf_config, gguf_file_of, gguf_tokenizer, load_gguf, read_header
from gatedattn.hf.importers import plan_for, read_hf_state
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.infra.integrity import check_tokenizer, verify_dir
from gatedattn.infra.io import recover_missing
from gatedattn.infra.sizes import check_model_size

MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")


def verify_model_dir(directory: str | Path) -> None:
    """The one check of a model directory of any format before it is used: with a
    ``checksums.json`` (every directory gatedattn writes), ``config.json`` and the
    weights must be listed and every listed file (the tokenizer too) unchanged; the weights
    are hashed as they are read (``read_safetensors`` / ``TensorSource``), so they are
    not read twice here."""
    gguf = gguf_file_of(directory)
    if gguf is not None:  # a GGUF file has no manifest: its header is checked (no tensor data is read)
        read_header(gguf)
        return
    directory = Path(directory)
    read_config(directory)  # present, listed, unchanged, and JSON of a sane depth
    verify_dir(directory, required=MODEL_FILES, skip=tuple(p.name for p in directory.glob("*.safetensors")))


_NESTED = {"rope": "RopeConfig", "gate": "GateConfig", "mla": "MLAConfig"}  # attention.<key> -> its config


def _check_nested(raw: dict[str, Any], source: str) -> None:
    """gatedattn's ``config.json``: the nested configs are JSON objects (or null where optional)."""
    attention = raw.get("attention")
    if "attention" in raw and not isinstance(attention, dict):
        raise GatedAttnError(f"{source}: 'attention' is {attention!r}; it must be an object of AttentionConfig "
                             f"fields (d_model, n_heads, ...), as save_pretrained writes it")
    for key, kind in _NESTED.items():
        value = (attention or {}).get(key)
        if value is not None and not isinstance(value, dict):
            raise GatedAttnError(f"{source}: 'attention.{key}' is {value!r}; it must be an object of {kind} "
                                 f"fields or null")


def load_model(directory: str | Path, *, dtype: torch.dtype | None = None,
               device: str | torch.device = "cpu") -> GatedLM:
    """Load any supported checkpoint directory, or a GGUF file (``gatedattn.hf.gguf``), as a
    ``GatedLM`` (float32 unless ``dtype``), verified first (:func:`verify_model_dir`); weights
    that are not floating point or hold NaN or infinity are refused, as is a model too large
    for the device's memory, and a ``device`` this machine does not have."""
    device = model_device(str(device))  # "nope", or "cuda" on a CPU build: one line, before anything is read
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise GatedAttnError(f"load_model: dtype={dtype!r} must be None or a floating torch.dtype (torch.float32, "
                             f"torch.bfloat16, torch.float16, torch.float64)")
    recover_missing(directory)  # a killed replace's previous copy is put back first
    gguf = gguf_file_of(directory)
    if gguf is not None:
        return load_gguf(gguf, dtype=dtype, device=device)
    directory = Path(directory)
    raw = read_config(directory)
    importer, source = plan_for(directory, raw)
    verify_model_dir(directory)
    if importer.plan is None:
        _check_nested(raw, source)
        check_model_size(ModelConfig.from_dict(raw), source, device)
        model = GatedLM.from_pretrained(directory)
    else:
        plan = importer.plan(raw, source)
        check_model_size(plan.cfg, source, device)
        state = read_hf_state(directory, plan, GatedLM.expected_state(plan.cfg))
        model = GatedLM.from_state(plan.cfg, state, directory, dtype)  # the tensors read, held once, in dtype
    model.eval()
    return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)


def load_config(directory: str | Path) -> ModelConfig:
    """The ``ModelConfig`` that ``load_model`` would build, without reading weights."""
    gguf = gguf_file_of(directory)
    if gguf is not None:
        return gguf_config(gguf)
    directory = Path(directory)
    raw = read_config(directory)
    importer, source = plan_for(directory, raw)
    if importer.plan is None:
        _check_nested(raw, source)
        return ModelConfig.from_dict(raw)
    return importer.plan(raw, str(directory / "config.json")).cfg


def model_tokenizer(path: str | Path):
    """The ``tokenizers.Tokenizer`` of any model path ``load_model`` reads: a directory's
    ``tokenizer.json`` or a GGUF file's embedded tokenizer; None when it has none."""
    gguf = gguf_file_of(path)
    if gguf is not None:
        return gguf_tokenizer(gguf)
    tokenizer = Path(path) / "tokenizer.json"
    return check_tokenizer(tokenizer) if tokenizer.is_file() else None

# names that moved to gatedattn.hf.importers: the old path warns for a release
_MOVED = ("NOT_SUPPORTED", "OFFICIAL_GATE_KEYS", "Plan", "hf_config_object", "quiet_transformers", "rope_from_hf",
          "Importer", "IMPORTERS", "importer_for", "Spec", "Q_LAYOUTS", "hf_specs")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"gatedattn.hf.load.{name} moved to gatedattn.hf.importers.{name} (the old path goes in "
                      f"the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
