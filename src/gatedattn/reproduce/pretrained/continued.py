"""Qiu et al. App. A.7 at CPU scale: the whole model trained on, as it is and with a G1
gate retrofitted (identity init), on the same windows in the same order."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from gatedattn.hf import add_gates
from gatedattn.models.lm import GatedLM
from gatedattn.reproduce.pretrained.config import PretrainedConfig

CONTINUED_RUNS = (("baseline", None), ("gated", "gated"))  # App. A.7: as it is, and with a G1 gate retrofitted
CONTINUED_FIGURES = ("f_attn", "sink_eps", "m_act", "m_act_ratio")  # the sink figures kept of each run


def continue_training(cfg: PretrainedConfig, base: GatedLM, variant: str | None,
                       pool: torch.Tensor) -> tuple[GatedLM, list[float]]:
    """A copy of ``base`` (with ``variant``'s gates retrofitted, identity init) trained whole
    with AdamW on ``pool`` in order, ``batch`` windows a step; the model and its losses."""
    model = copy.deepcopy(base)
    if variant is not None:
        add_gates(model, variant, init="identity")
    for p in model.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.continued_lr)
    curve = []
    model.train()
    for rows in pool.split(cfg.batch):
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return model, curve
