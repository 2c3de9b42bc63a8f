"""The one place that registers ``model_type: gatedattn`` with transformers' Auto classes.

``register_auto()`` makes ``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained(dir)``
read a directory written by ``GatedLM.save_pretrained`` (``GatedAttnHFConfig``,
``GatedAttnForCausalLM``). ``gatedattn.hf.hook`` calls it once transformers and these two
classes are imported, so a program rarely needs to; calling it again changes nothing.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from gatedattn.hf.auto import GatedAttnForCausalLM
from gatedattn.hf.configuration import GatedAttnHFConfig
from gatedattn.models.lm import MODEL_TYPE

__all__ = ["register_auto"]


def register_auto() -> None:
    """Register ``model_type: gatedattn`` with ``AutoConfig`` and ``AutoModelForCausalLM``
    (idempotent)."""
    AutoConfig.register(MODEL_TYPE, GatedAttnHFConfig, exist_ok=True)
    AutoModelForCausalLM.register(GatedAttnHFConfig, GatedAttnForCausalLM, exist_ok=True)
