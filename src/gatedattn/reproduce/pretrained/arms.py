"""What is trained in place of the first token: a learnable sink, an output gate, a control.

Every arm is added to a copy of the frozen model (:func:`build_arm`): ``sink`` and the
gates through :func:`gatedattn.hf.add_gates` with identity init (the model's outputs are
unchanged; a sink starts at logit 0 in the layers it trains, -30, that is absent, below),
the control as a bias on each layer's attention output, starting at 0, which has as many
parameters per layer as the residual stream is wide but no way to scale a head down. Only
the arm's parameters in the layers from ``start`` up train (Adam); everything else is
frozen, so the layers below ``start`` compute the same thing in every arm and run once
per window (:func:`gatedattn.reproduce.pretrained.masked.prefix`).

:func:`train_arm` trains one arm in one mode (first position dropped or kept) on the
windows of a pool in the order of one seed, so the two modes of an arm see the same
batches; :func:`head_stats` reads, per (layer, head), the attention left on the first
position, the learnable sink's probability and the mean gate score.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gatedattn.layers.core import WindowCore
from gatedattn.hf import add_gates
from gatedattn.models.casts import FrozenCasts
from gatedattn.models.lm import GatedLM
from gatedattn.ops.window import window_probs
from gatedattn.reproduce.pretrained.masked import attention_mode, prefix, tail_losses


@dataclass(frozen=True)
class Arm:
    """One arm: the preset it retrofits (None: the control's bias), the suffix of the
    parameter names it trains, and the config field holding its learning rate."""

    name: str
    what: str
    variant: str | None
    trains: str
    lr_field: str


ARM_SPECS = {a.name: a for a in (
    Arm("sink", "a learnable sink logit per head (GPT-OSS, HyGA)", "sink", "attn.sink", "sink_lr"),
    Arm("gate-headwise", "a G1 sigmoid gate, one score per head, from the layer input X (Qiu et al.)",
        "gated-headwise", "attn.gate.", "gate_lr"),
    Arm("gate", "a G1 sigmoid gate, one score per channel (Qiu et al.'s choice)", "gated", "attn.gate.", "gate_lr"),
    Arm("control", "a bias on each layer's attention output (no sink- or gate-like form)", None, "attn.o_proj.bias",
        "control_lr"),
)}


def build_arm(base: GatedLM, arm: Arm, start: int) -> tuple[GatedLM, list[nn.Parameter]]:
    """A copy of ``base`` with ``arm`` added; its trainable parameters (layers >= ``start``)."""
    model = copy.deepcopy(base)
    if arm.variant is not None:
        add_gates(model, arm.variant, init="identity")
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        for block in model.blocks[start:]:
            attn = block.attn
            if arm.name == "sink":
                attn.sink.zero_()
            if arm.name == "control":
                attn.o_proj.bias = nn.Parameter(torch.zeros(attn.o_proj.out_features))
    params = [p for name, p in model.named_parameters()
              if name.startswith("blocks.") and int(name.split(".")[1]) >= start and arm.trains in name]
    for p in params:
        p.requires_grad_(True)
    return model.eval(), params


def train_arm(model: GatedLM, params: list[nn.Parameter], lr: float, hidden: Tensor, targets: Tensor, order: Tensor,
              *, steps: int, batch: int, start: int, window: int, first: str) -> list[float]:
    """Adam over ``params`` for ``steps`` steps of ``batch`` pool windows taken in ``order``
    (cycling): ``hidden`` their residual stream entering block ``start`` (:func:`prefix`),
    ``targets`` their next tokens; the training loss of every step. Under autocast the
    frozen weights are cast once for every step (``FrozenCasts``)."""
    opt = torch.optim.Adam(params, lr=lr)
    frozen = FrozenCasts(model)
    curve = []
    for step in range(steps):
        rows = order[(torch.arange(batch) + step * batch) % len(order)]
        with frozen.applied():
            loss = tail_losses(model, hidden[rows], targets[rows], start, window, first).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return curve


class _RecordingCore(WindowCore):
    """A ``WindowCore`` that adds, per head, the attention on key 0 and the sink's
    probability summed over query positions 1.. (float64 sums)."""

    def __init__(self, window: int, first: str, sums: dict[str, Tensor]):
        super().__init__(window, first)
        self.sums = sums

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        probs = window_probs(q, k, sink, window=self.window, first=self.first, q_offset=q_offset, scale=scale)
        rows = probs[:, :, 1:]  # (B, H, T-1, Tk): queries after the first
        self.sums["first"] += rows[..., 0].double().sum((0, 2))
        self.sums["sink"] += (1 - rows.sum(-1)).double().sum((0, 2))
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (probs @ v.float()).to(q.dtype)


def head_stats(model: GatedLM, inputs: Tensor, window: int, first: str) -> dict[str, list[list[float]]]:
    """Per (layer, head), over the inputs (N, T) and query positions 1..T-1: ``first``
    attention on position 0, ``sink`` the learnable sink's probability, ``gate`` the mean
    gate score (None where a layer has no gate)."""
    n_heads = model.cfg.attention.n_heads
    sums = [{"first": torch.zeros(n_heads, dtype=torch.float64), "sink": torch.zeros(n_heads, dtype=torch.float64)}
            for _ in model.blocks]
    gates: list[list[Tensor]] = [[] for _ in model.blocks]
    with contextlib.ExitStack() as stack, torch.no_grad():
        for i, block in enumerate(model.blocks):
            stack.enter_context(block.attn.with_core(_RecordingCore(window, first, sums[i])))
            gate = block.attn.gate
            if gate is not None:
                hook = gate.score.register_forward_hook(
                    lambda _m, _i, out, i=i: gates[i].append(out[:, 1:].float().mean((0, 1, 3)).double()))
                stack.callback(hook.remove)
        model(inputs)
    count = inputs.shape[0] * (inputs.shape[1] - 1)
    return {
        "first": [(s["first"] / count).tolist() for s in sums],
        "sink": [(s["sink"] / count).tolist() for s in sums],
        "gate": [torch.stack(g).mean(0).tolist() if g else None for g in gates],
    }


__all__ = ["ARM_SPECS", "Arm", "attention_mode", "build_arm", "head_stats", "prefix", "train_arm"]
