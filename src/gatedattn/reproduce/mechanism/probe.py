"""What a model does on Bigram-Backcopy sequences, split by query class.

Query positions ``i >= 1`` of the input ``[BOS] x1 .. x_{T-1}`` fall in two classes:
*trigger* positions (``x_i`` is a trigger, so the next token is a copy of ``x_{i-1}``) and
*ordinary* positions (the next token is a bigram draw from ``x_i``). Position 0 (BOS) is in
neither. :func:`measure` reads the model through the analysis hooks
(:func:`gatedattn.analysis.probe.hooked`) plus one forward hook on each value projection,
in a single forward pass, and returns per layer and model-wide:

- ``bos_attn_{trigger,ordinary}``: attention probability on BOS (head-averaged);
- ``prev_attn_trigger``: attention of trigger positions on the token before them (the copy);
- ``sink_mass_{trigger,ordinary}``: probability on a learnable sink (variants with one),
  the mass missing from each row of the reference core's probabilities, i.e.
  ``sigmoid(b - logsumexp_j(q.k_j / sqrt(d)))``; ``sink_logit``: the sink logit ``b``
  itself (head mean), which that share compares with the scaled scores;
- ``value_norm_bos`` / ``value_norm_other``: L2 norm of the value vector at BOS vs the mean
  over the other positions (head-averaged);
- ``resid_norm_bos`` / ``resid_norm_other``: L2 norm of the residual stream after the layer
  at BOS vs the mean elsewhere; ``m_act`` (max |h|) and ``m_act_ratio`` (to the median |h|);
- ``gate_{trigger,ordinary}``: the layer's effective gate (the product of all its gate
  scores, averaged over heads and channels) on each class (gated variants);
- ``loss_copy`` / ``loss_bigram``: next-token cross-entropy on trigger / ordinary positions,
  beside ``bigram_floor``, the entropy of the true bigram rows at those positions (the
  lowest loss any model can reach there); the copy floor is 0.

Model-wide figures are means over layers, except M-Act (max over layers) and the losses.
F-Attn and Sink^eps are those of :mod:`gatedattn.analysis.metrics`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatedattn.analysis.metrics import first_token_attention, massive_activation, sink_fraction, sink_scores
from gatedattn.analysis.probe import attention_layers, hooked
from gatedattn.data.backcopy import BigramBackcopy

PER_LAYER = (
    "bos_attn_trigger", "bos_attn_ordinary", "prev_attn_trigger", "sink_mass_trigger", "sink_mass_ordinary",
    "value_norm_bos", "value_norm_other", "resid_norm_bos", "resid_norm_other", "m_act", "m_act_ratio",
    "gate_trigger", "gate_ordinary", "f_attn", "sink_logit",
)


def query_classes(inputs: np.ndarray | Tensor, task: BigramBackcopy) -> tuple[Tensor, Tensor]:
    """Boolean masks (B, T) of trigger and ordinary query positions of ``inputs`` (B, T);
    position 0 (BOS) is in neither."""
    ids = torch.as_tensor(np.asarray(inputs))
    trig = torch.as_tensor(task.is_trigger(ids.numpy()))
    body = torch.ones_like(trig)
    body[:, 0] = False
    return trig & body, ~trig & body


def _class_mean(values_BT: Tensor, mask_BT: Tensor) -> float:
    n = int(mask_BT.sum())
    return float(values_BT.double()[mask_BT].sum() / n) if n else math.nan


@torch.no_grad()
def measure(model: nn.Module, batch: np.ndarray | Tensor, task: BigramBackcopy) -> dict[str, Any]:
    """Every figure of the module docstring for one batch ``[BOS] + tokens`` (B, T + 1)."""
    batch = torch.as_tensor(np.asarray(batch), dtype=torch.long)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    trig, ordi = query_classes(inputs, task)
    blocks = attention_layers(model)
    L = len(blocks)
    per: dict[str, list[float]] = {k: [math.nan] * L for k in PER_LAYER}
    alphas: list[Tensor] = [torch.zeros(0)] * L
    gate_parts: list[list[Tensor]] = [[] for _ in range(L)]

    def on_probs(layer: int, probs: Tensor) -> None:
        p = probs.double()  # (B, H, T, T)
        bos = p[..., 0].mean(1)  # (B, T)
        per["bos_attn_trigger"][layer] = _class_mean(bos, trig)
        per["bos_attn_ordinary"][layer] = _class_mean(bos, ordi)
        prev = torch.diagonal(p, offset=-1, dim1=-2, dim2=-1).mean(1)  # (B, T-1): A[i, i-1], i >= 1
        per["prev_attn_trigger"][layer] = _class_mean(prev, trig[:, 1:])
        if blocks[layer].attn.sink is not None:
            missing = (1.0 - p.sum(-1)).clamp_min(0.0).mean(1)  # (B, T)
            per["sink_mass_trigger"][layer] = _class_mean(missing, trig)
            per["sink_mass_ordinary"][layer] = _class_mean(missing, ordi)
        per["f_attn"][layer] = first_token_attention(probs)
        alphas[layer] = sink_scores(probs)

    def on_hidden(layer: int, h: Tensor) -> None:
        norms = h.double().norm(dim=-1)  # (B, T)
        per["resid_norm_bos"][layer] = float(norms[:, 0].mean())
        per["resid_norm_other"][layer] = float(norms[:, 1:].mean())
        m = massive_activation(h)
        per["m_act"][layer], per["m_act_ratio"][layer] = m["max_abs"], m["ratio"]

    def on_gate(layer: int, name: str, scores: Tensor) -> None:
        B, T = scores.shape[:2]  # (B, T, G, D) elementwise, (B, T, G) or (B, T, G, 1) headwise
        gate_parts[layer].append(scores.double().reshape(B, T, scores.shape[2] if scores.dim() > 2 else 1, -1))

    for i, b in enumerate(blocks):
        if b.attn.sink is not None:
            per["sink_logit"][i] = float(b.attn.sink.detach().double().mean())
    handles = [_value_hook(b.attn, i, per) for i, b in enumerate(blocks)]
    try:
        with hooked(model, on_probs=on_probs, on_hidden=on_hidden, on_gate=on_gate):
            logits = model(inputs)
    finally:
        for h in handles:
            h.remove()
    for layer, parts in enumerate(gate_parts):
        if parts:
            effective = parts[0]
            for s in parts[1:]:
                effective = effective * s  # (B, T, G, D) times (B, T, G, 1)
            g = effective.flatten(2).mean(-1)  # (B, T)
            per["gate_trigger"][layer] = _class_mean(g, trig)
            per["gate_ordinary"][layer] = _class_mean(g, ordi)

    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    table = torch.as_tensor(task.table)
    row_entropy = -(table * table.clamp_min(1e-300).log()).sum(1)  # (n_chars,)
    cur = inputs.clamp(max=task.n_chars - 1)  # BOS is never an ordinary position
    out: dict[str, Any] = {
        "loss_copy": _class_mean(ce, trig), "loss_bigram": _class_mean(ce, ordi),
        "bigram_floor": _class_mean(row_entropy[cur], ordi),
        "trigger_fraction": float(trig.sum() / (trig.sum() + ordi.sum())),
        "sink_eps": sink_fraction(alphas),
        "uniform_bos_attn_trigger": _class_mean(1.0 / (1 + torch.arange(inputs.shape[1])).expand_as(trig), trig),
        "uniform_bos_attn_ordinary": _class_mean(1.0 / (1 + torch.arange(inputs.shape[1])).expand_as(ordi), ordi),
    }
    for key, values in per.items():
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            out[key] = None
        elif key in ("m_act", "m_act_ratio"):
            out[key] = max(finite)
        else:
            out[key] = float(np.mean(finite))
        out[f"{key}_per_layer"] = [None if math.isnan(v) else v for v in values]
    return out


def _value_hook(attn: nn.Module, layer: int, per: dict[str, list[float]]):
    """Forward hook on the value projection: per-head L2 norm of v at BOS vs elsewhere."""
    n_kv, head_dim = attn.cfg.n_kv_heads, attn.cfg.v_dim

    def hook(module, inputs, output):
        B, T, _ = output.shape
        norms = output.detach().double().view(B, T, n_kv, head_dim).norm(dim=-1).mean(-1)  # (B, T)
        per["value_norm_bos"][layer] = float(norms[:, 0].mean())
        per["value_norm_other"][layer] = float(norms[:, 1:].mean())

    return attn.qkv.v_proj.register_forward_hook(hook)
