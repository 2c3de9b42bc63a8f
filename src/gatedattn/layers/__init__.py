"""The attention layer and its parts.

- ``config``: ``AttentionConfig`` and its sub-configs, one frozen object per variant.
- ``variants``: the named presets of both papers (``VARIANTS``).
- ``attention``: the layer (projections, gates, sink, a swappable core).
- ``gates``: the gate modules every gate of both papers is composed of.
- ``core``: the attention cores (fused SDPA, naive reference, windowed, probes).
- ``rope``, ``norm``: rotary positions and RMSNorm.
- ``cache``: the key/value cache for incremental decoding.
- ``cost``: parameters and FLOPs of one layer, by part.

The kernels the cores call live in ``gatedattn.ops``; the language model built from these
layers in ``gatedattn.models``.
"""
