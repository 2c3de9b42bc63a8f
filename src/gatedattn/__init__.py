"""gatedattn: gated softmax attention for PyTorch language models.

Gated Attention (Qiu et al. 2025), Hybrid Gated Attention (HyGA) and learnable
attention sinks as one composable layer, with models, training and analysis.

Names are imported on first use, so ``import gatedattn`` (and the command line's
``--help``) does not pay for importing PyTorch until a name that needs it is used.
"""

from __future__ import annotations

from gatedattn.infra.lazy import lazy_exports
from gatedattn.infra.version import __version__

_EXPORTS = {
    "Attention": "gatedattn.layers.attention",
    "KVCache": "gatedattn.layers.cache",
    "AttentionConfig": "gatedattn.layers.config",
    "GateConfig": "gatedattn.layers.config",
    "MLAConfig": "gatedattn.layers.config",
    "RopeConfig": "gatedattn.layers.config",
    "Cost": "gatedattn.layers.cost",
    "cost": "gatedattn.layers.cost",
    "ConfigError": "gatedattn.infra.errors",
    "GatedAttnError": "gatedattn.infra.errors",
    "GatedLM": "gatedattn.models.lm",
    "ModelConfig": "gatedattn.models.lm",
    "VARIANTS": "gatedattn.layers.variants",
    "get_variant": "gatedattn.layers.variants",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


from gatedattn.hf.hook import register_when_imported as _register_when_imported  # noqa: E402

_register_when_imported()  # AutoModelForCausalLM reads "gatedattn" directories once transformers loads
