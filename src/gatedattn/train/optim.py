"""Optimisers and the learning-rate schedule.

``build_optimizer(model, cfg)`` returns an :class:`Optimizers` holding AdamW alone, or
(``cfg.optimizer == "muon"``) ``torch.optim.Muon`` for the 2-D hidden matrices plus AdamW
for the rest, as in the HyGA paper; AdamW runs fused where it can (:func:`fusable`).
Weight decay applies to the weight matrices of linear layers and embeddings only, never to
norms, biases, static gate logits or sinks.

``lr_at(step, ...)`` is the schedule as a pure function of the step, so resuming needs no
scheduler state: linear warm-up to ``lr`` over ``warmup_steps`` updates, then cosine (or
linear, or constant) decay that reaches ``lr * min_lr_ratio`` at the last update.

``freeze(model, cfg.trainable)`` leaves only the parameters ``TrainConfig.trainable``
names trainable (``requires_grad``); the others get no gradient and are in no optimizer.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Iterable

import torch
from torch import nn

from gatedattn.infra.errors import ConfigError
from gatedattn.layers.gates import PerHeadLinear
from gatedattn.train.config import TRAINABLE_GROUPS


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
    """AdamW (``cfg.optimizer == "adamw"``) or Muon for hidden matrices + AdamW (``"muon"``),
    over the trainable parameters; an optimizer left without parameters (every hidden
    matrix frozen, or every other parameter) is not built."""
    parts = split_parameters(model)
    adam_kw = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    optimizers: list[torch.optim.Optimizer] = []
    if cfg.optimizer == "muon":
        if parts["matrix"]:
            optimizers.append(torch.optim.Muon(
                [p for _, p in parts["matrix"]], lr=cfg.lr, weight_decay=cfg.weight_decay,
                momentum=cfg.muon_momentum, nesterov=True, adjust_lr_fn="match_rms_adamw",
            ))
        decay = parts["decay"]
    else:
        decay = parts["matrix"] + parts["decay"]
    groups = [
        {"params": [p for _, p in decay], "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in parts["no_decay"]], "weight_decay": 0.0},
    ]
    if any(g["params"] for g in groups):
        params = [p for g in groups for p in g["params"]]
        optimizers.append(torch.optim.AdamW([g for g in groups if g["params"]], fused=fusable(params), **adam_kw))
    if not optimizers:
        raise ConfigError("TrainConfig.trainable leaves no parameter to train")
    opt = Optimizers(optimizers)
    for g in opt.param_groups:
        g["base_lr"] = g["lr"]
    return opt


def fusable(params: Iterable[torch.Tensor]) -> bool | None:
    """``fused=True`` for AdamW where its one-kernel step exists (floating-point parameters,
    all on the CPU or all on one CUDA device), else None (torch's default). On a CPU the
    default steps parameter by parameter with about ten ops each, the fused step all of them
    at once (``docs/benchmarks/real-model.md``). transformers' Trainer picks the fused AdamW
    too (``adamw_torch_fused``)."""
    params = list(params)
    devices = {p.device for p in params}
    if not params or len(devices) != 1 or next(iter(devices)).type not in ("cpu", "cuda"):
        return None
    return True if all(p.dtype.is_floating_point for p in params) else None


# ---------------------------------------------------------------------------- frozen parameters
def matches(selector: str, name: str) -> bool:
    """Whether the ``TrainConfig.trainable`` entry ``selector`` (a group of
    :data:`~gatedattn.train.config.TRAINABLE_GROUPS`, else an fnmatch pattern) names the
    parameter ``name``."""
    if selector == "all":
        return True
    if selector == "gates":
        return ".gate." in f".{name}"
    if selector == "sink":
        return name.rpartition(".")[2] == "sink"
    return fnmatch.fnmatchcase(name, selector)


def trainable_names(names: Iterable[str], selectors: Iterable[str]) -> set[str]:
    """The parameter names (of ``names``) that ``selectors`` choose; a selector that
    chooses none is refused, naming the groups and a few of the model's parameters."""
    names = list(names)
    chosen: set[str] = set()
    for selector in selectors:
        hit = {n for n in names if matches(selector, n)}
        if not hit:
            raise ConfigError(f"TrainConfig.trainable: {selector!r} matches no parameter of the model; give a group "
                              f"({', '.join(TRAINABLE_GROUPS)}) or an fnmatch pattern over the parameter names, "
                              f"such as {', '.join(_example_names(names))}")
        chosen |= hit
    return chosen


def _example_names(names: list[str], n: int = 5) -> list[str]:
    """A few parameter names across the model: those outside the blocks and of block 0."""
    pool = [x for x in names if not x.startswith("blocks.") or x.startswith("blocks.0.")] or names
    step = max(1, len(pool) // n)
    return pool[::step][:n]


def freeze(model: nn.Module, selectors: Iterable[str]) -> list[str]:
    """Leave trainable only the parameters ``selectors`` choose (none given: all of them)
    and freeze the rest (``requires_grad=False``: no gradient is computed for them and
    :func:`build_optimizer` leaves them out); returns the trainable names. A tied
    parameter trains when any of its names is chosen."""
    named = list(model.named_parameters(remove_duplicate=False))
    selectors = tuple(selectors)
    if not selectors:
        return [n for n, p in named if p.requires_grad]
    keep = trainable_names([n for n, _ in named], selectors)
    train_ids = {id(p) for n, p in named if n in keep}
    for _, p in named:
        p.requires_grad_(id(p) in train_ids)
    return [n for n, p in named if id(p) in train_ids]
