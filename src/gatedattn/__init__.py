"""gatedattn: gated softmax attention for PyTorch language models.

Gated Attention (Qiu et al. 2025), Hybrid Gated Attention (HyGA) and learnable
attention sinks as one composable layer, with models, training and analysis.
"""

from gatedattn.attention import Attention
from gatedattn.cache import KVCache
from gatedattn.config import AttentionConfig, GateConfig, MLAConfig, RopeConfig
from gatedattn.cost import Cost, cost
from gatedattn.errors import ConfigError, GatedAttnError
from gatedattn.model import GatedLM, ModelConfig
from gatedattn.variants import VARIANTS, get_variant

__version__ = "0.1.0"

from gatedattn.hf.hook import register_when_imported as _register_when_imported

_register_when_imported()  # AutoModelForCausalLM reads "gatedattn" directories once transformers loads

__all__ = [
    "Attention",
    "AttentionConfig",
    "ConfigError",
    "Cost",
    "GateConfig",
    "GatedAttnError",
    "GatedLM",
    "KVCache",
    "MLAConfig",
    "ModelConfig",
    "RopeConfig",
    "VARIANTS",
    "cost",
    "get_variant",
]
