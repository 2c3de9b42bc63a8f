"""Optimisers and the learning-rate schedule.

``build_optimizer(model, cfg)`` returns an :class:`Optimizers` holding AdamW alone, or
(``cfg.optimizer == "muon"``) ``torch.optim.Muon`` for the 2-D hidden matrices plus AdamW
for the rest, as in the HyGA paper. Weight decay applies to the weight matrices of
linear layers and embeddings only, never to norms, biases, static gate logits or sinks.

``lr_at(step, ...)`` is the schedule as a pure function of the step, so resuming needs no
scheduler state: linear warm-up to ``lr`` over ``warmup_steps`` updates, then cosine (or
linear, or constant) decay that reaches ``lr * min_lr_ratio`` at the last update.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from gatedattn.gates import PerHeadLinear


def lr_at(step: int, *, lr: float, total_steps: int, warmup_steps: int = 0,
          min_lr_ratio: float = 0.0, schedule: str = "cosine") -> float:
    """Learning rate of update ``step`` (0-based) out of ``total_steps``.

    Warm-up: ``lr * (step + 1) / warmup_steps`` for ``step < warmup_steps``. Then, with
    ``p = (step - warmup_steps) / (total_steps - 1 - warmup_steps)`` (clamped to [0, 1]; 0 when
    no step is left after the warm-up),
    ``min_lr + (lr - min_lr) * f(p)``, ``f(p) = (1 + cos(pi p)) / 2`` (cosine), ``1 - p``
    (linear) or ``1`` (constant, which never decays).
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    min_lr = lr * min_lr_ratio
    span = total_steps - 1 - warmup_steps
    p = 0.0 if span <= 0 else min(max((step - warmup_steps) / span, 0.0), 1.0)  # no room to decay: peak
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - p)
    raise ValueError(f"unknown schedule {schedule!r}")


def lr_schedule(cfg, total_steps: int) -> list[float]:
    """``lr_at`` for every update of a run of ``cfg`` (a TrainConfig)."""
    return [lr_at(s, lr=cfg.lr, total_steps=total_steps, warmup_steps=cfg.warmup_steps,
                  min_lr_ratio=cfg.min_lr_ratio, schedule=cfg.schedule) for s in range(total_steps)]


def split_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters by role: ``matrix`` (2-D weights of linear layers inside the
    model body: Muon's share), ``decay`` (other weight matrices: embeddings, LM head,
    per-head gate MLPs) and ``no_decay`` (norm gains, biases, sinks, static gate logits).
    Tied parameters appear once."""
    embed_like = {id(m) for name, m in model.named_modules() if name in ("embed", "lm_head")}
    out: dict[str, list[tuple[str, nn.Parameter]]] = {"matrix": [], "decay": [], "no_decay": []}
    seen: set[int] = set()
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            full = f"{mname}.{pname}" if mname else pname
            is_weight = pname == "weight" and isinstance(module, (nn.Linear, nn.Embedding, PerHeadLinear))
            if is_weight and isinstance(module, nn.Linear) and p.ndim == 2 and id(module) not in embed_like:
                out["matrix"].append((full, p))
            elif is_weight:
                out["decay"].append((full, p))
            else:
                out["no_decay"].append((full, p))
    return out


class Optimizers:
    """One or two torch optimisers stepped together (AdamW, or Muon + AdamW).

    Each param group keeps its peak rate in ``base_lr``; :meth:`set_lr_factor` scales all
    groups by the schedule. ``state_dict`` / ``load_state_dict`` round-trip exactly.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    def set_lr_factor(self, factor: float) -> None:
        for g in self.param_groups:
            g["lr"] = g["base_lr"] * factor

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        states = state["optimizers"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"optimizer state holds {len(states)} optimizers, this run has {len(self.optimizers)}")
        for o, s in zip(self.optimizers, states):
            o.load_state_dict(s)


def build_optimizer(model: nn.Module, cfg) -> Optimizers:
    """AdamW (``cfg.optimizer == "adamw"``) or Muon for hidden matrices + AdamW (``"muon"``)."""
    parts = split_parameters(model)
    adam_kw = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    if cfg.optimizer == "muon":
        muon = torch.optim.Muon(
            [p for _, p in parts["matrix"]], lr=cfg.lr, weight_decay=cfg.weight_decay,
            momentum=cfg.muon_momentum, nesterov=True, adjust_lr_fn="match_rms_adamw",
        )
        decay = parts["decay"]
        optimizers = [muon]
    else:
        decay = parts["matrix"] + parts["decay"]
        optimizers = []
    groups = [
        {"params": [p for _, p in decay], "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in parts["no_decay"]], "weight_decay": 0.0},
    ]
    optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], **adam_kw))
    opt = Optimizers(optimizers)
    for g in opt.param_groups:
        g["base_lr"] = g["lr"]
    return opt
