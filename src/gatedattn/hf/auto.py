"""transformers Auto classes for gatedattn's own checkpoint format.

After ``register_auto()``, ``AutoConfig.from_pretrained(dir)`` and
``AutoModelForCausalLM.from_pretrained(dir)`` work on a directory written by
``GatedLM.save_pretrained`` (``"model_type": "gatedattn"``), for every attention
variant, and ``.generate()`` works on the result.

``GatedAttnForCausalLM`` is a ``PreTrainedModel`` + ``GenerationMixin`` holding a
``GatedLM`` as ``self.model``. Loading goes through ``GatedLM.from_pretrained`` (so a
missing or mis-shaped tensor is an error, never a randomly initialised one), saving
through ``GatedLM.save_pretrained`` (the directory stays in gatedattn format).
Generation uses transformers' ``DynamicCache``: each layer's keys and values go
through a small adapter that gives it the ``KVCache`` interface ``Attention`` expects.

The wrapper follows ``LlamaForCausalLM``'s conventions: a 2-D ``attention_mask`` (1 =
token, 0 = padding, left or right; padded keys get zero attention), ``position_ids``
(default ``cumsum(attention_mask) - 1``), ``inputs_embeds``, ``labels`` with -100 for
ignored positions (transformers' causal-LM loss, ``num_items_in_batch`` included), the
embedding accessors and ``resize_token_embeddings``, activation checkpointing
(``activation_checkpointing_enable(every_n_layers=n)``). A 4-D custom mask is refused.

This module imports transformers (seconds); ``gatedattn.hf`` imports it on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutputWithPast

from gatedattn.infra.errors import GatedAttnError
from gatedattn.hf.configuration import GatedAttnHFConfig
from gatedattn.models.lm import MODEL_TYPE, GatedLM

__all__ = ["GatedAttnForCausalLM", "GatedAttnHFConfig", "register_auto"]

# from_pretrained arguments that do not change what a local gatedattn directory loads as
_IGNORED_LOAD_ARGS = frozenset({
    "_from_auto", "_from_pipeline", "_commit_hash", "trust_remote_code", "attn_implementation",
    "low_cpu_mem_usage", "use_safetensors", "local_files_only", "cache_dir", "revision", "token",
    "force_download", "proxies", "code_revision", "adapter_kwargs",
})


class _LayerCache:
    """One layer of a transformers ``Cache`` with the ``KVCache`` interface."""

    def __init__(self, cache: Cache, layer_idx: int):
        self.cache, self.layer_idx = cache, layer_idx

    @property
    def length(self) -> int:
        return self.cache.get_seq_length(self.layer_idx)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, self.layer_idx)

    def update_latent(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MLA: latent (B, T, r) and shared RoPE key (B, T, 1, d) stored as one-head keys and values."""
        latent_all, k_rope_all = self.cache.update(latent[:, None], k_rope.transpose(1, 2), self.layer_idx)
        return latent_all[:, 0], k_rope_all.transpose(1, 2)


def _one_device(device_map: Any) -> str | torch.device:
    """The device a ``from_pretrained`` ``device_map`` names: one device (name, index or
    ``torch.device``), ``"auto"``, or a dict that puts the whole model (``""``) on one device."""
    if isinstance(device_map, dict) and set(device_map) == {""}:
        device_map = device_map[""]
    if isinstance(device_map, dict):
        raise GatedAttnError("GatedAttnForCausalLM.from_pretrained: a device_map dict that splits the model "
                             "is not supported; pass one device")
    if isinstance(device_map, int):
        return f"cuda:{device_map}"
    if device_map == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device_map


class GatedAttnForCausalLM(PreTrainedModel, GenerationMixin):
    """A ``GatedLM`` (``self.model``) behind the transformers model interface."""

    config_class = GatedAttnHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_sdpa = True
    supports_gradient_checkpointing = True

    def __init__(self, config: GatedAttnHFConfig, model: GatedLM | None = None):
        super().__init__(config)
        self.model = model if model is not None else GatedLM(config.to_model_config())
        self.post_init()

    def _init_weights(self, module) -> None:  # GatedLM initialises itself
        pass

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value) -> None:
        self.model.set_input_embeddings(value)
        self.config.vocab_size = self.model.cfg.vocab_size

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings) -> None:
        self.model.set_output_embeddings(new_embeddings)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=checkpoint,
                                    every_n_layers: int = 1) -> None:
        """transformers' activation-checkpointing switch: blocks 0, n, 2n, ... recompute
        their activations in backward (training mode, no KV cache)."""
        self.model.set_activation_checkpointing(every_n_layers if enable else 0, gradient_checkpointing_func)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Also takes a state dict in gatedattn's format (``GatedLM`` keys, as
        ``save_pretrained`` writes them; what transformers' Trainer reads back on resume)."""
        prefix = self.base_model_prefix + "."
        if state_dict and not any(k.startswith(prefix) for k in state_dict):
            state_dict = {prefix + k: v for k, v in state_dict.items()}
            tied = prefix + "lm_head.weight"
            if self.model.cfg.tie_embeddings and tied not in state_dict and prefix + "embed.weight" in state_dict:
                state_dict[tied] = state_dict[prefix + "embed.weight"]
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, dtype=None,
                        torch_dtype=None, device_map=None, subfolder: str = "", **kwargs):
        """Load a local gatedattn directory (strictly, through ``GatedLM.from_pretrained``)."""
        if model_args:
            raise GatedAttnError("GatedAttnForCausalLM.from_pretrained takes no extra positional arguments")
        # (an argument left at None asks for nothing: evaluation harnesses pass gguf_file=None and the like)
        unknown = sorted(k for k, v in kwargs.items() if k not in _IGNORED_LOAD_ARGS and v is not None)
        if unknown:
            raise GatedAttnError(f"GatedAttnForCausalLM.from_pretrained: argument {unknown[0]!r} is not supported")
        path = Path(pretrained_model_name_or_path) / subfolder
        if not path.is_dir():
            raise GatedAttnError(f"{path} is not a local directory; gatedattn models load from local directories")
        lm = GatedLM.from_pretrained(path)
        if isinstance(config, GatedAttnHFConfig) and config.to_model_config() != lm.cfg:
            raise GatedAttnError(f"{path}: the config passed to from_pretrained differs from the saved config.json")
        dtype = dtype if dtype is not None else torch_dtype
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if dtype is not None and dtype != "auto":
            lm = lm.to(dtype)
        if device_map is not None:
            lm = lm.to(_one_device(device_map))
        model = cls(GatedAttnHFConfig.from_model_config(lm.cfg), model=lm)
        model.eval()
        return model

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs) -> None:
        """Write gatedattn's format (``config.json`` + ``model.safetensors``) of the model's
        own weights (a ``state_dict`` argument holds the same tensors and is not read)."""
        if is_main_process:
            self.model.save_pretrained(save_directory)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Cache | None = None,
                past_key_values: Cache | None = None, inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                logits_to_keep: int = 0, return_dict: bool | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2):
            what = f"{attention_mask.dim()}-D" if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
            raise GatedAttnError(f"GatedAttnForCausalLM takes a 2-D attention_mask (batch, past + new tokens; "
                                 f"1 = token, 0 = padding), got a {what} one: custom masks are not supported")
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache and not (self.training and self.model.checkpoint_every):
            cache = DynamicCache()
        caches = [_LayerCache(cache, i) for i in range(len(self.model.blocks))] if cache is not None else None
        logits = self.model(input_ids, positions=position_ids, caches=caches, attention_mask=attention_mask,
                            inputs_embeds=inputs_embeds)
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, logits.shape[-1], num_items_in_batch=kwargs.get("num_items_in_batch"))
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)


def register_auto() -> None:
    """Register ``model_type: gatedattn`` with ``AutoConfig`` and ``AutoModelForCausalLM``
    (idempotent)."""
    AutoConfig.register(MODEL_TYPE, GatedAttnHFConfig, exist_ok=True)
    AutoModelForCausalLM.register(GatedAttnHFConfig, GatedAttnForCausalLM, exist_ok=True)


if __name__ == "gatedattn.hf.auto":  # imported from the package (not as a self-contained copy)
    register_auto()
