"""Retrofit a gate (or a sink) into a loaded model, in place.

``add_gates(model, variant, init)`` replaces every block's ``Attention`` by one built
from ``model.cfg.attention`` plus the gate (and/or sink) of the preset ``variant``,
copies every existing weight, and updates ``model.cfg`` so that ``save_pretrained`` /
``from_pretrained`` round-trip the result.

``init="identity"`` keeps the model's function. The final projection of every gate
logit is zeroed (X-gate ``W`` or low-rank ``W_u``, H-gate ``W_u``, C-gate ``W_c``,
static logits), so each gate outputs a constant ``s`` at the start: 0.5 for a sigmoid
gate, 0.25 for HyGA (X+H sigmoid times C-gate sigmoid), 0.75 for NS-sigmoid. The
linear map next to the gate is divided by ``s`` (``o_proj`` for G1/G5, ``v_proj`` for
G2, ``k_proj`` for G3, ``q_proj`` for G4), which undoes the constant exactly when ``s``
is a power of two and to float rounding otherwise. The gates start in their
responsive range (sigmoid slope 1/4), not saturated, so they train from the first
step. Gates whose score is 0 at logit 0 (SiLU or identity activation, multiplied)
get a bias (``GateConfig.bias=True``) set so that the score is 1. Additive gates
(``Y + SiLU(logit)``) are exact with zero logits.

A newly added sink starts absent but trainable: in each head, where it takes at most
``SINK_SHARE`` (1e-3) of any query's attention, measured on ``calibration`` ids (default:
a fixed draw of random tokens; :func:`sink_starts`). Its probability is the only residual
error (at most about 1e-3 relative, far less at most queries), and its gradient is large
enough for Adam to move it (a sink started far below every head's scores, e.g. at -30, is exact to 1e-13
but its gradient, about 1e-16, is below Adam's epsilon: it never trains). A given
``sink_logit`` starts every head there instead.

``init="random"`` initialises the new parameters as ``GatedLM`` does for a fresh
model (Normal(0, init_std) weights, zero biases, static logits and sink), which does
not keep the model's function.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from gatedattn.layers.attention import Attention
from gatedattn.layers.config import AttentionConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.models.lm import GatedLM
from gatedattn.layers.variants import get_variant

INITS = ("identity", "random")
SINK_SHARE = 1e-3  # a retrofitted sink's start: at most this share of any calibration query's attention
CALIBRATION_SEED, CALIBRATION_SHAPE = 0, (2, 64)  # the default draw of random token ids
# the linear map whose output (g2-g4) or input (g1, g5) the gate scales
_COMPENSATE = {"g1": "o_proj", "g5": "o_proj", "g2": "qkv.v_proj", "g3": "qkv.k_proj", "g4": "qkv.q_proj"}


def _new_attention_config(old: AttentionConfig, variant: str, init: str) -> AttentionConfig:
    if old.gate is not None:
        raise GatedAttnError("the model already has a gate; add_gates retrofits gate-free models only")
    if old.head_transform != "none":
        raise GatedAttnError(f"the model has head_transform={old.head_transform!r}; add_gates retrofits "
                             f"plain attention only")
    changes = get_variant(variant).make(old.head_dim)
    if not changes:
        raise GatedAttnError(f"variant {variant!r} adds nothing to retrofit; choose a gated variant")
    other = sorted(set(changes) - {"gate", "sink"})
    if other:
        raise GatedAttnError(f"variant {variant!r} sets {other[0]}={changes[other[0]]!r}, which is not a gate; "
                             f"add_gates retrofits gates and sinks only")
    gate = changes.get("gate")
    if gate is not None:
        if old.kv == "mla" and gate.position in ("g2", "g3", "g4"):
            raise GatedAttnError(f"variant {variant!r} gates a projection ({gate.position}); retrofitting it "
                                 f"into an MLA model is not supported")
        if init == "identity" and gate.combine == "multiply" and gate.activation in ("silu", "identity") \
                and gate.source != "none":
            gate = dataclasses.replace(gate, bias=gate.bias or gate.source == "input")
    return old.replace(gate=gate, sink=old.sink or bool(changes.get("sink", False)))


@torch.no_grad()
def _init_random(attn: Attention, new_names: set[str], init_std: float) -> None:
    """The new gate as ``GatedLM`` initialises a fresh one; a new sink at zero."""
    if attn.gate is not None and any(n.startswith("gate.") for n in new_names):
        attn.gate.reset_parameters(init_std)
    if "sink" in new_names:
        attn.sink.zero_()


class _LseCore(nn.Module):
    """A core that records, per head, the least logsumexp of a query's causal scores (how
    much attention mass a sink logit competes with, where it competes with least), then
    attends as ``core``."""

    def __init__(self, core: nn.Module, sums: list[torch.Tensor]):
        super().__init__()
        self.core, self.sums = core, sums

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None, **kw):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).float()
        scores = (q.float() @ kk.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
        tq, tk = scores.shape[-2:]
        future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(q_offset + 1)
        lse = scores.masked_fill(future, float("-inf")).logsumexp(-1)  # (B, H, Tq)
        self.sums.append(lse.double().amin((0, 2)))
        return self.core(q, k, v, sink, q_offset=q_offset, scale=scale, **kw)


@torch.no_grad()
def sink_starts(model: GatedLM, calibration: torch.Tensor | None = None,
                share: float = SINK_SHARE) -> list[torch.Tensor]:
    """Per layer, the logit (H,) at which a sink takes at most ``share`` of any query's
    attention in each head: log(share) + the head's least logsumexp of a query's causal
    scores over ``calibration`` (token ids (B, T); default a fixed draw of random ids)."""
    if calibration is None:
        shape = (CALIBRATION_SHAPE[0], min(CALIBRATION_SHAPE[1], model.cfg.max_seq_len))
        calibration = torch.randint(0, model.cfg.vocab_size, shape,
                                    generator=torch.Generator().manual_seed(CALIBRATION_SEED))
    if calibration.dtype not in (torch.int32, torch.int64) or calibration.dim() != 2:
        raise GatedAttnError(f"calibration must be integer token ids of shape (batch, seq_len), got "
                             f"{calibration.dtype} of shape {tuple(calibration.shape)}")
    sums: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    saved = [b.attn.core for b in model.blocks]
    was_training = model.training
    try:
        for block, acc in zip(model.blocks, sums):
            block.attn.core = _LseCore(block.attn.core, acc)
        model.eval()(calibration.to(model.embed.weight.device))
    finally:
        for block, core in zip(model.blocks, saved):
            block.attn.core = core
        model.train(was_training)
    return [torch.stack(acc).amin(0).float() + math.log(share) for acc in sums]


@torch.no_grad()
def _init_identity(attn: Attention, new_names: set[str], init_std: float, sink_logit: float | torch.Tensor) -> None:
    if "sink" in new_names:
        attn.sink.copy_(torch.as_tensor(sink_logit, dtype=attn.sink.dtype).expand_as(attn.sink))
    if attn.gate is None:
        return
    attn.gate.init_identity(init_std)
    _compensate(attn)


@torch.no_grad()
def _compensate(attn: Attention) -> None:
    """The gate is now a constant: find it, and undo it in the neighbouring linear map
    (the new layer is still float32 here; add_gates casts it to the model's dtype afterwards)."""
    cfg, gate, g = attn.cfg, attn.gate, attn.cfg.gate
    rng = torch.Generator().manual_seed(0)
    y = torch.rand(2, 3, gate.groups, gate.dim, generator=rng) + 0.5
    x = torch.randn(2, 3, cfg.d_model, generator=rng)
    ratio = gate(y, x) / y
    if g.combine == "add":
        if not torch.equal(ratio, torch.ones_like(ratio)):
            raise GatedAttnError(f"an additive {g.activation} gate is not zero at logit 0; no identity init")
        return
    scale = ratio.flatten()[0].item()
    if scale == 0 or not torch.allclose(ratio, torch.full_like(ratio, scale), rtol=0, atol=1e-6):
        raise GatedAttnError(f"the {g.activation} gate is not a non-zero constant at init; no identity init")
    linear: nn.Linear = attn.get_submodule(_COMPENSATE[g.position])
    linear.weight.div_(scale)
    if linear.bias is not None and g.position != "g1":
        linear.bias.div_(scale)


def add_gates(model: GatedLM, variant: str, init: str = "identity", *, sink_logit: float | None = None,
              calibration: torch.Tensor | None = None) -> GatedLM:
    """Add the gate (and/or sink) of preset ``variant`` to every attention layer of
    ``model`` in place; returns ``model``. See the module docstring for ``init``, and for
    where a new sink starts (``sink_logit`` for every head, else measured on
    ``calibration`` token ids by :func:`sink_starts`)."""
    if init not in INITS:
        raise GatedAttnError(f"init={init!r} is not allowed; choose one of {', '.join(INITS)}")
    if sink_logit is not None and not (isinstance(sink_logit, (int, float)) and math.isfinite(sink_logit)):
        raise GatedAttnError(f"sink_logit={sink_logit!r} must be a finite number (or None: measured)")
    old_cfg = model.cfg.attention
    new_cfg = _new_attention_config(old_cfg, variant, init)
    starts = None
    if init == "identity" and new_cfg.sink and not old_cfg.sink and sink_logit is None:
        starts = sink_starts(model, calibration)  # measured on the model as it is, before any layer changes
    for i, block in enumerate(model.blocks):
        old: Attention = block.attn
        like = old.o_proj.weight
        new = Attention(new_cfg)
        result = new.load_state_dict(old.state_dict(), strict=False)
        if result.unexpected_keys:  # cannot happen for gate/sink presets; never drop weights silently
            raise GatedAttnError(f"retrofit would drop tensor {result.unexpected_keys[0]!r}")
        new_names = set(result.missing_keys)
        if init == "random":
            _init_random(new, new_names, model.cfg.init_std)
        else:
            _init_identity(new, new_names, model.cfg.init_std, starts[i] if starts is not None else
                           (sink_logit if sink_logit is not None else 0.0))
        block.attn = new.to(device=like.device, dtype=like.dtype).train(old.training)
    model.cfg = model.cfg.replace(attention=new_cfg, variant=variant)
    return model
