"""Parameter count and forward FLOPs of one attention layer, split by part.

Parts: ``projections`` (q/k/v/o projections and q/k norms), ``attention`` (the causal
core: QK^T, softmax, PV) and ``gate`` (every gate module, the sink and the per-head
output transform). Parameters are counted on a layer built on the meta device, so the
count is exactly what ``Attention(cfg)`` holds. FLOPs count a multiply-add as 2 and
one per element for activations, softmax steps and gating products. The gates counted are
those of docs/design.md sections 1-3.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from gatedattn.layers.attention import Attention
from gatedattn.layers.config import AttentionConfig

@dataclass(frozen=True)
class Cost:
    """Per-part parameter counts and forward FLOPs for one sequence of ``seq_len`` tokens."""

    seq_len: int
    params: dict[str, int]
    flops: dict[str, int]

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_params"], d["total_flops"] = self.total_params, self.total_flops
        return d


def gate_modules(layer: Attention) -> list[nn.Module]:
    """The modules of ``layer`` that are not plain attention: its gate and head transform."""
    return [m for m in (layer.gate, layer.head_transform) if m is not None]


def cost(cfg: AttentionConfig, seq_len: int) -> Cost:
    """Parameters and FLOPs of ``Attention(cfg)`` on one causal sequence of ``seq_len``."""
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len} must be > 0")
    with torch.device("meta"):
        layer = Attention(cfg)
    extra = gate_modules(layer)
    gate_params = {id(p) for m in extra for p in m.parameters()}
    if layer.sink is not None:
        gate_params.add(id(layer.sink))
    in_gate = {id(sub) for m in extra for sub in m.modules()}
    params = {"projections": 0, "attention": 0, "gate": 0}
    for p in layer.parameters():
        params["gate" if id(p) in gate_params else "projections"] += p.numel()

    T, H = seq_len, cfg.n_heads
    projections = sum(
        2 * m.in_features * m.out_features * T + (m.out_features * T if m.bias is not None else 0)
        for m in layer.modules()
        if isinstance(m, nn.Linear) and id(m) not in in_gate
    )
    pairs = T * (T + 1) // 2  # causal (query, key) pairs
    attention = 2 * H * pairs * (cfg.qk_dim + cfg.v_dim) + 3 * H * pairs
    gate = layer.gate.flops(T) if layer.gate is not None else 0
    if cfg.sink:
        gate += 3 * H * T  # sigmoid(lse - b) and the rescale, per row
    if cfg.head_transform != "none":
        gate += 4 * H * cfg.v_dim * T
    return Cost(seq_len, params, {"projections": projections, "attention": attention, "gate": gate})
