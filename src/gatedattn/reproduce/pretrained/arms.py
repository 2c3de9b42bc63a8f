"""What is trained in place of the first token: a learnable sink, an output gate, a control;
and how each arm is run (:class:`ArmRunner`).

Every arm is added to a copy of the frozen model (:func:`build_arm`): the sinks and the
gates through :func:`gatedattn.hf.add_gates` with identity init (the gates leave the
model's outputs unchanged; a sink starts, in the layers it trains, at each head's measured
first-token logit (:func:`first_token_logits`) or at 0 with the first token dropped, and
just below a hundredth of the first token's weight where the first token is kept
(:func:`sink_start`); it stays absent, -30, below), the
control as a bias on each layer's attention output, starting at 0, which has as many
parameters per layer as the residual stream is wide but no way to scale a head down;
``sink-bias`` has both. Only the arm's parameters in the layers from ``start`` up train
(Adam); everything else is frozen, so the layers below ``start`` compute the same thing in
every arm and run once per window (:func:`gatedattn.reproduce.pretrained.masked.prefix`).

:func:`train_pair` trains one arm in both modes (first position dropped and kept) on the
same batches of a pool in the order of one seed, until the paired loss on a few held-out
development windows stops improving (:func:`stop_step`); :func:`head_stats` reads, per (layer, head), the attention left on
the first position, the learnable sink's probability and the mean gate score.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gatedattn.layers.core import WindowCore
from gatedattn.hf import add_gates
from gatedattn.models.casts import FrozenCasts
from gatedattn.models.lm import GatedLM
from gatedattn.ops.window import window_probs
from gatedattn.infra.precision import Precision, resolve_dtype
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.pretrained.masked import DROPPED, KEPT, attention_mode, position_losses, prefix, tail_losses
from gatedattn.reproduce.pretrained.measure import bins

HEAD_WINDOWS = 4  # held-out windows the per-head figures of each arm are read on


@dataclass(frozen=True)
class Arm:
    """One arm: the preset it retrofits (None: no gate or sink), the parameters it trains
    (name suffix -> the config field holding their learning rate), whether it adds a bias
    on each layer's attention output, and where its sink logits start (``measured``: each
    head's mean first-token logit, ``zero``)."""

    name: str
    what: str
    variant: str | None
    trains: tuple[tuple[str, str], ...]
    bias: bool = False
    sink_init: str | None = None


_SINK, _BIAS, _GATE = ("attn.sink", "sink_lr"), ("attn.o_proj.bias", "control_lr"), ("attn.gate.", "gate_lr")
ARM_SPECS = {a.name: a for a in (
    Arm("sink", "a learnable sink logit per head (GPT-OSS, HyGA), started at the head's measured first-token logit",
        "sink", (_SINK,), sink_init="measured"),
    Arm("sink-zero", "the same sink, its logits started at 0", "sink", (_SINK,), sink_init="zero"),
    Arm("sink-bias", "the sink and the control's bias together (mass and value)", "sink", (_SINK, _BIAS), bias=True,
        sink_init="measured"),
    Arm("gate-headwise", "a G1 sigmoid gate, one score per head, from the layer input X (Qiu et al.)",
        "gated-headwise", (_GATE,)),
    Arm("gate", "a G1 sigmoid gate, one score per channel (Qiu et al.'s choice)", "gated", (_GATE,)),
    Arm("control", "a bias on each layer's attention output (no sink- or gate-like form)", None, (_BIAS,), bias=True),
)}


KEPT_SINK_SHARE = 0.01  # with the first token kept, a sink starts at this share of its weight
ABSENT_SINK = -30.0  # a sink's logit below the layers an arm trains: no probability, no gradient


def sink_start(arm: Arm, mode: str, measured: Tensor) -> Tensor:
    """Where ``arm``'s sink logits (H,) start in one layer of the copy trained in ``mode``,
    ``measured`` that layer's mean first-token logit per head. With the first token dropped
    the sink takes its place (``measured``) or starts at 0 (``sink-zero``). With it kept,
    the model needs no sink: it starts absent but trainable, at ``KEPT_SINK_SHARE`` of the
    first token's weight (a sink at the first token's logit would halve that token's
    attention and start the kept copy damaged, which the paired figure would count as
    recovery)."""
    if mode == KEPT:
        return measured + math.log(KEPT_SINK_SHARE)
    return measured.clone() if arm.sink_init == "measured" else torch.zeros_like(measured)


def build_arm(base: GatedLM, arm: Arm, start: int, sink_logits: list[Tensor] | None = None,
              lrs: dict[str, float] | None = None, mode: str = DROPPED) -> tuple[GatedLM, list[dict]]:
    """A copy of ``base`` with ``arm`` added for training in ``mode``; its trainable
    parameters (layers >= ``start``) as Adam parameter groups (each with its learning rate
    from ``lrs``, config field -> value). A sink starts where :func:`sink_start` says in the
    layers it trains (``sink_logits[layer]``: the measured first-token logit per head, needed
    by a sink arm except ``sink-zero`` with the first token dropped); below ``start`` it stays
    absent (-30)."""
    model = copy.deepcopy(base)
    if arm.variant is not None:
        add_gates(model, arm.variant, init="identity", sink_logit=ABSENT_SINK)
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        for i, block in enumerate(model.blocks[start:], start):
            attn = block.attn
            if attn.sink is not None:
                needs = mode == KEPT or arm.sink_init == "measured"
                if needs and sink_logits is None:
                    raise ValueError(f"arm {arm.name!r} in mode {mode!r} starts its sink from the measured "
                                     "first-token logits: give sink_logits")
                attn.sink.copy_(sink_start(arm, mode, sink_logits[i] if needs else torch.zeros_like(attn.sink)))
            if arm.bias:
                attn.o_proj.bias = nn.Parameter(torch.zeros(attn.o_proj.out_features))
    groups = []
    for suffix, lr_field in arm.trains:
        params = [p for name, p in model.named_parameters()
                  if name.startswith("blocks.") and int(name.split(".")[1]) >= start and suffix in name]
        for p in params:
            p.requires_grad_(True)
        groups.append({"params": params, "lr": (lrs or {}).get(lr_field, 1e-3), "field": lr_field})
    return model.eval(), groups


def stop_step(looks: list[float], patience: int, tol: float) -> int | None:
    """The stopping rule on the paired losses measured at each look (the first before any
    step): the index of the first look that makes ``patience`` in a row none of which is
    below the best of the looks before them by more than ``tol`` nats; None while it keeps
    improving."""
    for k in range(patience, len(looks)):
        best = min(looks[:k - patience + 1])
        if min(looks[k - patience + 1:k + 1]) >= best - tol:
            return k
    return None


def _adam(groups: list[dict]) -> torch.optim.Adam:
    return torch.optim.Adam([{"params": g["params"], "lr": g["lr"]} for g in groups])


def _step(model: GatedLM, opt: torch.optim.Optimizer, frozen: FrozenCasts, hidden: Tensor, targets: Tensor,
          start: int, window: int, first: str, autocast=contextlib.nullcontext) -> float:
    """One Adam step of an arm on one batch (under ``autocast()``); its training loss."""
    with autocast(), frozen.applied():
        loss = tail_losses(model, hidden, targets, start, window, first).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def _rows(order: Tensor, step: int, batch: int) -> Tensor:
    return order[(torch.arange(batch) + step * batch) % len(order)]


def _paired_dev(models: dict[str, GatedLM], dev: dict[str, Tensor], dev_targets: Tensor, start: int,
                window: int, frozen: dict[str, FrozenCasts] | None = None, autocast=contextlib.nullcontext) -> float:
    """The paired loss (dropped minus kept) on the development windows, under ``autocast()``
    (the steps' precision; ``frozen``: each mode's cast weights)."""
    losses = {}
    with torch.no_grad(), autocast():
        for m, model in models.items():
            with frozen[m].applied() if frozen else contextlib.nullcontext():
                losses[m] = tail_losses(model, dev[m], dev_targets, start, window, m).float().mean().item()
    return losses[DROPPED] - losses[KEPT]


def train_pair(models: dict[str, GatedLM], groups: dict[str, list[dict]], hidden: dict[str, Tensor],
               targets: Tensor, order: Tensor, dev: dict[str, Tensor], dev_targets: Tensor, *, steps: int,
               batch: int, start: int, window: int, every: int, patience: int, tol: float,
               autocast=contextlib.nullcontext) -> dict[str, Any]:
    """Adam over each mode's copy of the arm (``models``: mode -> model, ``groups`` its
    parameter groups) on the same ``batch`` pool windows a step, taken in ``order``
    (cycling), ``hidden`` each mode's residual stream entering block ``start``. Every
    ``every`` steps (and before the first) it looks at the paired loss (dropped minus kept)
    on the development windows (``dev``: each mode's residual stream, ``dev_targets``), and
    stops by :func:`stop_step` on those looks, at ``steps`` at the most. Returns each mode's
    training curve, the paired training curve, the looks (step, paired loss), the steps run
    and whether the rule stopped it (``converged``). Each step and each look runs under
    ``autocast()`` (bf16 where the study asks: the rule reads the loss the arm trains on),
    the frozen weights then cast once for all of them (``FrozenCasts``)."""
    opts = {m: _adam(groups[m]) for m in models}
    frozen = {m: FrozenCasts(model) for m, model in models.items()}
    curves: dict[str, list[float]] = {m: [] for m in models}
    paired: list[float] = []
    looks = [(0, _paired_dev(models, dev, dev_targets, start, window, frozen, autocast))]
    stopped = None
    for step in range(steps):
        rows = _rows(order, step, batch)
        for mode, model in models.items():
            curves[mode].append(_step(model, opts[mode], frozen[mode], hidden[mode][rows], targets[rows], start,
                                      window, mode, autocast))
        paired.append(curves[DROPPED][-1] - curves[KEPT][-1])
        if (step + 1) % every == 0 or step + 1 == steps:
            looks.append((step + 1, _paired_dev(models, dev, dev_targets, start, window, frozen, autocast)))
            stopped = stop_step([v for _, v in looks], patience, tol)
            if stopped is not None:
                break
    return {"curves": curves, "paired": paired, "looks": looks, "steps": len(paired),
            "converged": stopped is not None}


def train_arm(model: GatedLM, groups: list[dict], hidden: Tensor, targets: Tensor, order: Tensor, *, steps: int,
              batch: int, start: int, window: int, first: str) -> list[float]:
    """One mode of :func:`train_pair` alone, for ``steps`` steps: the training loss of every
    step."""
    opt, frozen = _adam(groups), FrozenCasts(model)
    return [_step(model, opt, frozen, hidden[rows], targets[rows], start, window, first)
            for rows in (_rows(order, step, batch) for step in range(steps))]


class _LogitCore(WindowCore):
    """A ``WindowCore`` that collects, per head, the mean pre-softmax logit of queries 1.. on
    key 0 (what a sink logit would have to be to take key 0's place)."""

    def __init__(self, window: int, first: str, sums: list[Tensor]):
        super().__init__(window, first)
        self.sums = sums

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        k0 = k[:, :, :1].repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, 1, D)
        logits = (q.float() @ k0.float().transpose(-1, -2))[:, :, 1:, 0] * scale  # (B, H, T-1)
        self.sums.append(logits.double().mean((0, 2)))
        return super().forward(q, k, v, sink, q_offset=q_offset, scale=scale)


def first_token_logits(model: GatedLM, inputs: Tensor, window: int) -> list[Tensor]:
    """Per layer, each head's mean logit (H,) on position 0 from queries 1.. over ``inputs``
    (N, T), first token kept, ``window`` attention."""
    sums: list[list[Tensor]] = [[] for _ in model.blocks]
    with contextlib.ExitStack() as stack, torch.no_grad():
        for block, acc in zip(model.blocks, sums):
            stack.enter_context(block.attn.with_core(_LogitCore(window, KEPT, acc)))
        for rows in inputs.split(4):
            model(rows)
    return [torch.stack(acc).mean(0).float() for acc in sums]


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


@functools.cache
def arm_precision(dtype: str) -> Precision:
    """The precision the arms' steps and the stopping rule's looks run in, and why
    (``dtype`` resolved once a process); the held-out evaluations run outside it, in fp32."""
    return resolve_dtype(dtype, "cpu")


class ArmRunner:
    """The arms' shared inputs: the frozen model, the layer they train from, the window, the
    cached residual stream of the pool, the development windows the stopping rule reads and
    the held-out windows in both modes, the measured first-token logits (a sink's start) and
    the streaming row."""

    def __init__(self, cfg: PretrainedConfig, model: GatedLM, pool, dev, evals, start: int, window: int,
                 sink_logits: list[list[float]], stream_row: torch.Tensor):
        self.cfg, self.model, self.start, self.window = cfg, model, start, window
        self.pool_targets, self.dev_targets, self.eval_targets = pool[:, 1:], dev[:, 1:], evals[:, 1:]
        self.eval_inputs = evals[:, :-1]
        self.sink_logits = [torch.tensor(layer) for layer in sink_logits]
        self.precision = arm_precision(cfg.dtype)
        self.stream_row = stream_row
        self.pool_hidden = {m: prefix(model, pool[:, :-1], start, window, m) for m in (KEPT, DROPPED)}
        self.dev_hidden = {m: prefix(model, dev[:, :-1], start, window, m) for m in (KEPT, DROPPED)}
        self.eval_hidden = {m: prefix(model, evals[:, :-1], start, window, m) for m in (KEPT, DROPPED)}

    def eval_loss(self, model: GatedLM, mode: str) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([tail_losses(model, h, t, self.start, self.window, mode)
                              for h, t in zip(self.eval_hidden[mode].split(4), self.eval_targets.split(4))])

    def run(self, arm_name: str, seed: int) -> dict[str, Any]:
        """One arm trained in both modes on the pool in seed ``seed``'s order, on the same
        batches, until the stopping rule; per mode its held-out loss and training curve, the
        per-head figures and trained sink (dropped mode), and for the first order its
        streaming curve (first token dropped)."""
        cfg, arm = self.cfg, ARM_SPECS[arm_name]
        lrs = {f: getattr(cfg, f) for f in ("sink_lr", "gate_lr", "control_lr")}
        built = {m: build_arm(self.model, arm, self.start, self.sink_logits, lrs, m) for m in (DROPPED, KEPT)}
        order = torch.randperm(len(self.pool_targets), generator=torch.Generator().manual_seed(seed))
        trained = train_pair({m: b[0] for m, b in built.items()}, {m: b[1] for m, b in built.items()},
                             self.pool_hidden, self.pool_targets, order, self.dev_hidden, self.dev_targets,
                             steps=cfg.steps, batch=cfg.batch, start=self.start, window=self.window,
                             every=cfg.stop_every, patience=cfg.stop_patience, tol=cfg.stop_tol,
                             autocast=functools.partial(self.precision.autocast, "cpu"))
        out: dict[str, Any] = {"steps": trained["steps"], "converged": trained["converged"],
                               "paired_curve": trained["paired"], "looks": trained["looks"]}
        for mode, (model, groups) in built.items():
            losses = self.eval_loss(model, mode)
            out[mode] = {"loss": losses.mean().item(), "losses": losses.tolist(), "curve": trained["curves"][mode],
                         "params": sum(p.numel() for g in groups for p in g["params"])}
        model = built[DROPPED][0]
        out[DROPPED]["heads"] = head_stats(model, self.eval_inputs[:HEAD_WINDOWS], self.window, DROPPED)
        if arm.sink_init is not None:
            out[DROPPED]["sink_logits"] = [b.attn.sink.tolist() for b in model.blocks]
        if seed == 0:
            out["streaming"] = bins(position_losses(model, self.stream_row, self.window, DROPPED))
        return out


__all__ = ["ARM_SPECS", "ArmRunner", "HEAD_WINDOWS", "arm_precision", "KEPT_SINK_SHARE", "Arm", "attention_mode", "build_arm", "first_token_logits", "head_stats", "prefix",
           "sink_start", "stop_step", "train_arm", "train_pair"]
