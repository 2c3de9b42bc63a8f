"""Models built from the attention layer.

- ``lm``: ``GatedLM`` and ``ModelConfig``, a decoder-only language model with any variant.
- ``mfu``: model FLOPs per token and the utilisation a run reaches against a measured peak.

Checkpoint import and export (HuggingFace, GGUF) live in ``gatedattn.hf``.
"""
