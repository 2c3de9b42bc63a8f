"""transformers Auto classes for gatedattn's own checkpoint format.

Once ``gatedattn.hf.register`` has registered them, ``AutoConfig.from_pretrained(dir)`` and
``AutoModelForCausalLM.from_pretrained(dir)`` work on a directory written by
``GatedLM.save_pretrained`` (``"model_type": "gatedattn"``), for every attention
variant, and ``.generate()`` works on the result.

``GatedAttnForCausalLM`` is a ``PreTrainedModel`` + ``GenerationMixin`` holding a
``GatedLM`` as ``self.model``. Loading goes through ``GatedLM.from_pretrained`` (so a
missing or mis-shaped tensor is an error, never a randomly initialised one), with
keyword arguments overriding the config as in transformers; saving goes through
``GatedLM.save_pretrained`` (the directory stays in gatedattn format) and writes the
modelling code, ``auto_map`` and ``generation_config.json`` beside the weights.
Generation uses transformers' caches (dynamic or static): each layer's keys and values go
through a small adapter that gives it the ``KVCache`` interface ``Attention`` expects; a
decoding step compiled over the static cache (``compile_config``) takes ``hf.static``'s.

The wrapper follows ``LlamaForCausalLM``'s conventions: a 2-D ``attention_mask`` (1 =
token, 0 = padding, left or right; padded keys get zero attention) or the 4-D
causal-plus-padding mask transformers builds for a static cache, ``position_ids``
(default ``cumsum(attention_mask) - 1``), ``inputs_embeds``, ``labels`` with -100 for
ignored positions (transformers' causal-LM loss, ``num_items_in_batch`` included),
``output_hidden_states`` / ``output_attentions`` (``gatedattn.hf.outputs``),
``return_dict=False``, the embedding accessors and ``resize_token_embeddings``,
activation checkpointing (``activation_checkpointing_enable(every_n_layers=n)``). Any
other 4-D mask is refused.

``attn_implementation`` means what it says, through ``from_pretrained`` (this class's or
the Auto classes'), ``config._attn_implementation`` before ``GatedAttnForCausalLM(config)``,
and ``set_attn_implementation``: ``"eager"`` gives every layer the reference core
(``layers.core.ReferenceCore``: explicit scores and softmax), which also returns its
probabilities for ``output_attentions`` (nothing swapped, no warning); ``"sdpa"`` (the
default) runs the fused kernel of the model's own ``kernel`` setting, where
``output_attentions`` swaps in a recording reference core for the call and warns once.
Anything else is refused in one line, before any weights are read. The choice is a runtime
one, as in transformers: ``config._attn_implementation`` reports what runs, and neither
the saved weights nor ``config.json`` change (the default for a model whose ``kernel`` is
``reference`` is ``"eager"``).

This module imports transformers (seconds); ``gatedattn.hf`` imports it on first use.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import GenerationConfig, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import GENERATION_CONFIG_NAME

from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.integrity import record
from gatedattn.hf.configuration import GatedAttnHFConfig
from gatedattn.hf.static import LatentAsKeys, static_step_inputs, takes_static_step
from gatedattn.hf.masks import WHAT, padding_mask_of
from gatedattn.hf.outputs import recording
from gatedattn.layers.config import AttentionConfig
from gatedattn.layers.core import AttentionCore, ReferenceCore
from gatedattn.models.lm import MODEL_TYPE, GatedLM, check_state_dict
from gatedattn.models.shards import parse_size
from gatedattn.ops.row_linear import RowProducts

__all__ = ["GatedAttnForCausalLM", "GatedAttnHFConfig"]

# from_pretrained arguments that do not change what a local gatedattn directory loads as
_IGNORED_LOAD_ARGS = frozenset({
    "_from_auto", "_from_pipeline", "_commit_hash", "trust_remote_code", "low_cpu_mem_usage",
    "use_safetensors", "local_files_only", "cache_dir", "revision", "token", "force_download", "proxies",
    "code_revision", "adapter_kwargs",
})
# transformers' attn_implementation values the wrapper runs: the reference core, or the model's fused kernel
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# save_pretrained arguments that change nothing for a local gatedattn directory
_IGNORED_SAVE_ARGS = frozenset({"save_function", "token", "save_peft_format", "save_original_format",
                                "distributed_checkpoint"})


def _config_attribute(config: GatedAttnHFConfig, key: str) -> bool:
    """Whether ``key`` names a field, alias or property of the config (what a keyword may override)."""
    return (key in {f.name for f in dataclasses.fields(config)} or key in config.attribute_map
            or isinstance(getattr(type(config), key, None), property))


def check_attn_implementation(value: Any) -> str | None:
    """``value`` if it is an ``attn_implementation`` the wrapper runs (None: the default);
    anything else is refused in one line naming the allowed values."""
    if value is None or (isinstance(value, str) and value in ATTN_IMPLEMENTATIONS):
        return value
    raise ConfigError(f"GatedAttnForCausalLM: attn_implementation={value!r} is not supported; choose "
                      f"\"eager\" (the reference attention: explicit scores and softmax, returns attention weights) "
                      f"or \"sdpa\" (the default: the model's fused kernel)")


def _fused_kernel(cfg: AttentionConfig) -> str:
    """The kernel ``"sdpa"`` runs in a layer of ``cfg``: its own, or the fused one ``auto``
    picks where its own is the reference kernel."""
    kernel = cfg.resolved_kernel
    return kernel if kernel != "reference" else cfg.replace(kernel="auto").resolved_kernel


def _load_config(config: PreTrainedConfig | None, lm: GatedLM, overrides: dict[str, Any],
                 attn_implementation: str | None) -> GatedAttnHFConfig:
    """The config ``from_pretrained`` builds the model from: ``config`` (a copy) or the
    loaded model's, with the ``overrides`` set and ``attn_implementation`` (None: the default)."""
    if config is None:
        hf_config = GatedAttnHFConfig.from_model_config(lm.cfg)
    elif isinstance(config, GatedAttnHFConfig):
        hf_config = copy.deepcopy(config)
    elif getattr(config, "model_type", None) == MODEL_TYPE and isinstance(config, PreTrainedConfig):
        # the same class from another copy of the modelling code (transformers loads remote code per file)
        hf_config = GatedAttnHFConfig.from_dict(config.to_dict())
    else:
        raise GatedAttnError(f"GatedAttnForCausalLM.from_pretrained: config must be a GatedAttnHFConfig, "
                             f"got {type(config).__name__}")
    # (set after the overrides: transformers' output_attentions=True asks for eager only when nothing was asked)
    hf_config._attn_implementation = None
    # head_dim after hidden_size / num_attention_heads: given beside them, it is kept, not derived again
    for key, value in sorted(overrides.items(), key=lambda kv: kv[0] == "head_dim"):
        if not _config_attribute(hf_config, key):
            raise GatedAttnError(f"GatedAttnForCausalLM.from_pretrained: argument {key!r} is not supported "
                                 f"(neither a loading option nor a GatedAttnHFConfig attribute)")
        setattr(hf_config, key, value)
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    return hf_config


def _with_config(lm: GatedLM, cfg, source: Path) -> GatedLM:
    """``lm``'s weights in a model built from ``cfg`` (same tensors and shapes, or an error naming one)."""
    if cfg.tie_embeddings != lm.cfg.tie_embeddings:
        raise GatedAttnError(f"{source}: tie_word_embeddings (tie_embeddings) cannot be overridden at load; "
                             f"the saved weights are {'' if lm.cfg.tie_embeddings else 'un'}tied")
    model = GatedLM(cfg)
    check_state_dict(lm.state_dict(), model.state_dict(), f"{source} (with the config overrides)")
    model.load_state_dict(lm.state_dict())
    return model


class _LayerCache(LatentAsKeys):
    """One layer of a transformers ``Cache`` with the ``KVCache`` interface."""

    def __init__(self, cache: Cache, layer_idx: int):
        self.cache, self.layer_idx = cache, layer_idx

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length(self.layer_idx))

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, past + T, D): a static cache's buffers cut to the positions written."""
        end = self.length + k.shape[2]
        keys, values = self.cache.update(k, v, self.layer_idx)
        return keys[:, :, :end], values[:, :, :end]


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
        super().__init__(config)  # checks config._attn_implementation (_check_and_adjust_attn_implementation)
        self.model = model if model is not None else GatedLM(config.to_model_config())
        self._warned_attentions = False
        self._use_attn_implementation(self.config._attn_implementation)
        self.post_init()

    def _init_weights(self, module) -> None:  # GatedLM initialises itself
        pass

    # ------------------------------------------------------------------ attn_implementation
    # A runtime choice, as in transformers: it swaps each layer's attention core and is never
    # saved (config.json holds the model's own ``kernel``; the weights do not change).
    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        return True

    def _check_and_adjust_attn_implementation(self, attn_implementation: str | None, is_init_check: bool = False,
                                              allow_all_kernels: bool = False) -> str:
        """transformers' hook (``__init__``, ``set_attn_implementation``): ``"eager"`` or
        ``"sdpa"``; None gives the default, what the model's own ``kernel`` runs."""
        return check_attn_implementation(attn_implementation) or self._default_attn_implementation()

    def _default_attn_implementation(self) -> str:
        model = self._modules.get("model")  # (None while PreTrainedModel.__init__ runs)
        kernel = model.cfg.attention.kernel if model is not None else (self.config.attention or {}).get("kernel")
        return "eager" if kernel == "reference" else "sdpa"

    def set_attn_implementation(self, attn_implementation: str | dict, allow_all_kernels: bool = False) -> None:
        """Switch every layer to the reference core (``"eager"``) or the model's fused kernel
        (``"sdpa"``); anything else is refused and changes nothing."""
        if isinstance(attn_implementation, dict):
            attn_implementation = attn_implementation.get("", self.config._attn_implementation)
        self._use_attn_implementation(self._check_and_adjust_attn_implementation(attn_implementation))

    def _use_attn_implementation(self, name: str | None) -> None:
        """Give every layer the core that ``name`` stands for and record it in the config, which
        then says what runs: ``"eager"`` the reference core (``ReferenceCore``, which also hands
        out its probabilities for ``output_attentions``), ``"sdpa"`` the fused kernel."""
        name = self._check_and_adjust_attn_implementation(name)
        for block in self.model.blocks:
            attn = block.attn
            if name == "eager":
                if not isinstance(attn.core, ReferenceCore):
                    attn.core = ReferenceCore()
            else:
                kernel = _fused_kernel(attn.cfg)
                if type(attn.core) is not AttentionCore or attn.core.kernel != kernel:
                    attn.core = AttentionCore(kernel)
        self.config._attn_implementation_internal = self._attn_running = name

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
        """Load a local gatedattn directory (strictly, through ``GatedLM.from_pretrained``).

        As in transformers, ``config`` replaces the saved config and the other keywords
        that name config attributes override it (``use_cache=False``,
        ``output_hidden_states=True``, ``max_position_embeddings=...``); the weights must
        then fit the config (a mismatch names the tensor). Any other keyword is refused.
        ``attn_implementation`` (here, or in ``config`` as the Auto classes pass it) is
        ``"eager"`` or ``"sdpa"``, checked before anything is read."""
        if model_args:
            raise GatedAttnError("GatedAttnForCausalLM.from_pretrained takes no extra positional arguments")
        attn_implementation = kwargs.pop("attn_implementation", None)
        if attn_implementation is None:
            attn_implementation = getattr(config, "_attn_implementation", None)
        attn_implementation = check_attn_implementation(attn_implementation)
        # (an argument left at None asks for nothing: evaluation harnesses pass gguf_file=None and the like)
        overrides = {k: v for k, v in kwargs.items() if k not in _IGNORED_LOAD_ARGS and v is not None}
        path = Path(pretrained_model_name_or_path) / subfolder
        if not path.is_dir():
            raise GatedAttnError(f"{path} is not a local directory; gatedattn models load from local directories")
        lm = GatedLM.from_pretrained(path)
        hf_config = _load_config(config, lm, overrides, attn_implementation)
        wanted = hf_config.to_model_config()
        if wanted != lm.cfg:
            lm = _with_config(lm, wanted, path)
        dtype = dtype if dtype is not None else torch_dtype
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if dtype is not None and dtype != "auto":
            lm = lm.to(dtype)
        if device_map is not None:
            lm = lm.to(_one_device(device_map))
        hf_config.name_or_path = str(pretrained_model_name_or_path)
        model = cls(hf_config, model=lm)
        if (path / GENERATION_CONFIG_NAME).is_file():
            model.generation_config = GenerationConfig.from_pretrained(path)
        model.eval()
        return model

    def save_pretrained(self, save_directory, is_main_process: bool = True, state_dict=None,
                        max_shard_size: int | str | None = None, save_code: bool = True,
                        self_contained: bool | None = None,
                        safe_serialization: bool = True, push_to_hub: bool = False, variant: str | None = None,
                        **kwargs) -> None:
        """Write gatedattn's format (``config.json``, ``model.safetensors`` or shards of at
        most ``max_shard_size`` with their index, ``generation_config.json``) of the
        model's own weights (a ``state_dict`` argument, as ``Trainer`` passes it, holds the
        same tensors and is not read). With ``save_code`` (the default; ``self_contained`` is its old name) the modelling
        code and ``auto_map`` are written too, so the directory loads with
        ``trust_remote_code=True`` where gatedattn is not installed -- also when this model
        was itself loaded that way."""
        unknown = sorted(k for k in kwargs if k not in _IGNORED_SAVE_ARGS)
        if unknown:
            raise GatedAttnError(f"GatedAttnForCausalLM.save_pretrained: argument {unknown[0]!r} is not supported")
        if push_to_hub:
            raise GatedAttnError("GatedAttnForCausalLM.save_pretrained: push_to_hub is not supported; "
                                 "the model saves to a local directory")
        if not safe_serialization or variant is not None:
            raise GatedAttnError("GatedAttnForCausalLM.save_pretrained writes safetensors without a variant "
                                 f"(safe_serialization=True, variant=None), got safe_serialization="
                                 f"{safe_serialization!r}, variant={variant!r}")
        shard_bytes = parse_size(max_shard_size, "max_shard_size") if max_shard_size is not None else None
        if not is_main_process:
            return

        def extra(tmp: Path) -> dict[str, Any]:
            if self.can_generate() and self.generation_config is not None:
                self.generation_config.save_pretrained(tmp)
                record(tmp / GENERATION_CONFIG_NAME)  # listed in checksums.json like every file the save writes
            return {}

        if self_contained is not None:
            warnings.warn("GatedAttnForCausalLM.save_pretrained(self_contained=...) is now save_code=... (and the "
                          "modelling code is written by default)", DeprecationWarning, stacklevel=2)
            save_code = self_contained
        self.model.save_pretrained(save_directory, extra=extra, max_shard_bytes=shard_bytes, save_code=save_code)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Cache | None = None,
                past_key_values: Cache | None = None, inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                output_attentions: bool | None = None, output_hidden_states: bool | list[int] | int | None = None,
                logits_to_keep: int = 0, return_dict: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast | tuple:
        if self.config._attn_implementation != self._attn_running:  # set on the config directly, as Llama reads it
            self._use_attn_implementation(self.config._attn_implementation)
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache and not (self.training and self.model.checkpoint_every):
            cache = DynamicCache()
        static, caches, attention_mask, position_ids = self._cache_inputs(cache, attention_mask, position_ids,
                                                                          input_ids, inputs_embeds)
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        selected = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        if output_attentions:
            self._warn_reference_attentions()
        with recording(self.model, hidden_states=selected is not False and selected is not None,
                       attentions=bool(output_attentions)) as recorded, \
                RowProducts() if static else contextlib.nullcontext():  # ops.row_linear: one-row products as loops
            logits = self.model(input_ids, positions=position_ids, caches=caches, attention_mask=attention_mask,
                                inputs_embeds=inputs_embeds)
        loss = None
        if labels is not None:
            loss = ForCausalLMLoss(logits, labels, logits.shape[-1], num_items_in_batch=kwargs.get("num_items_in_batch"))
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        out = CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache,
                                     hidden_states=_select(recorded.hidden_states, selected),
                                     attentions=recorded.attentions)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return out if return_dict else out.to_tuple()

    def _cache_inputs(self, cache, attention_mask, position_ids, input_ids, inputs_embeds):
        """Whether this is a compiled decoding step over a static cache (``hf.static``: no
        number read, no mask pattern checked), the layers' caches, the padding or key mask
        and the positions the model takes."""
        source = input_ids if input_ids is not None else inputs_embeds
        if takes_static_step(cache, attention_mask, source.shape[1] if source is not None else 0):
            return (True, *static_step_inputs(cache, attention_mask, position_ids, len(self.model.blocks)))
        caches = [_LayerCache(cache, i) for i in range(len(self.model.blocks))] if cache is not None else None
        return False, caches, self._padding_mask(attention_mask, input_ids, inputs_embeds, caches), position_ids

    def _padding_mask(self, mask, input_ids, inputs_embeds, caches) -> torch.Tensor | None:
        """The 2-D padding mask the model takes: as given, or read from a 4-D causal-plus-padding mask."""
        if mask is None or (isinstance(mask, torch.Tensor) and mask.dim() == 2):
            return mask
        if not isinstance(mask, torch.Tensor):
            raise GatedAttnError(f"{WHAT}, got a {type(mask).__name__}: custom masks are not supported")
        if mask.dim() != 4:
            raise GatedAttnError(f"{WHAT} or a 4-D causal-plus-padding one, got a {mask.dim()}-D one")
        source = input_ids if input_ids is not None else inputs_embeds
        past = caches[0].length if caches is not None else 0
        return padding_mask_of(mask, source.shape[0], past, source.shape[1])

    def _warn_reference_attentions(self) -> None:
        kernels = sorted({b.attn.core.kernel for b in self.model.blocks if hasattr(b.attn.core, "kernel")} - {"reference"})
        if kernels and not self._warned_attentions:
            self._warned_attentions = True
            warnings.warn(f"GatedAttnForCausalLM: the {'/'.join(kernels)} attention kernel does not return attention "
                          f"probabilities; with output_attentions=True every layer runs the reference kernel "
                          f"(explicit scores and softmax: slower, more memory); attn_implementation=\"eager\" "
                          f"runs it throughout", stacklevel=3)


def _select(states: tuple[torch.Tensor, ...] | None, selected: Any) -> tuple[torch.Tensor, ...] | None:
    """All hidden states (``output_hidden_states=True``), or those at the given indices."""
    if states is None or isinstance(selected, bool):
        return states
    indices = [selected] if isinstance(selected, int) else list(selected)
    n = len(states)
    return tuple(states[i] for i in indices if -n <= i < n)
