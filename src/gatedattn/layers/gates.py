"""Gate modules: small pieces that compose into every gate of both papers.

A ``Gate`` scales (or shifts) a tensor ``Y`` of shape (B, T, G, D) -- G heads of D
channels -- with scores computed from the layer input X (the X-gate), from Y itself
(HyGA's H-gate, fused with the X-gate logits) and across heads (HyGA's C-gate).
Every score passes through a ``GateScore`` module, so analysis code can read gate
activations with forward hooks. The formulas are those of docs/design.md sections 1 (the
gate's axes) and 2 (HyGA's X-, H- and C-gates and their fusion).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gatedattn.layers.config import GateConfig
from gatedattn.layers.norm import RMSNorm


def _uniform_(p: torch.Tensor, fan_in: int) -> torch.Tensor:
    """nn.Linear's default init for a weight with ``fan_in`` inputs."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.init.uniform_(p, -bound, bound)


def _reset_linear(linear: nn.Module, std: float) -> None:
    if isinstance(linear, PerHeadLinear):
        linear.reset_parameters(std)
        return
    nn.init.normal_(linear.weight, 0.0, std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def _silu_inverse_of_one() -> float:
    """b with b * sigmoid(b) = 1 (Newton)."""
    b = 1.0
    for _ in range(50):
        s = 1.0 / (1.0 + math.exp(-b))
        f, df = b * s - 1.0, s + b * s * (1.0 - s)
        b -= f / df
    return b


def identity_logit(cfg: GateConfig) -> float:
    """The X-gate logit an identity initialisation starts from: where a multiplied SiLU
    (or identity) score is 1; 0 for sigmoid-type scores and for additive gates."""
    if cfg.combine != "multiply":
        return 0.0
    return {"silu": _silu_inverse_of_one(), "identity": 1.0}.get(cfg.activation, 0.0)


class GateScore(nn.Module):
    """Logits -> gate scores. ``ns-sigmoid`` is 0.5 + 0.5 sigmoid, range [0.5, 1]."""

    def __init__(self, activation: str):
        super().__init__()
        self.activation = activation

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if self.activation == "sigmoid":
            return torch.sigmoid(logits)
        if self.activation == "silu":
            return F.silu(logits)
        if self.activation == "ns-sigmoid":
            return 0.5 + 0.5 * torch.sigmoid(logits)
        return logits  # identity

    def extra_repr(self) -> str:
        return self.activation


class PerHeadLinear(nn.Module):
    """G independent linear maps, one per head: (..., G, n_in) -> (..., G, n_out)."""

    def __init__(self, groups: int, n_in: int, n_out: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(_uniform_(torch.empty(groups, n_in, n_out), n_in))
        self.bias = nn.Parameter(torch.zeros(groups, n_out)) if bias else None

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        nn.init.normal_(self.weight, 0.0, std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x_GI: torch.Tensor) -> torch.Tensor:
        y = torch.einsum("...gi,gio->...go", x_GI, self.weight.to(x_GI.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def flops(self, n_tokens: int) -> int:
        return 2 * self.weight.numel() * n_tokens


class XLogits(nn.Module):
    """X-gate logits (B, T, G, W): ``X W`` (full rank), ``SiLU(X W_d) W_u`` per head
    (``rank`` > 0), or a learned constant (``static``), shape (1, 1, G, W)."""

    def __init__(self, cfg: GateConfig, d_model: int, groups: int, width: int):
        super().__init__()
        self.groups, self.width, self.rank = groups, width, cfg.rank
        self.static = cfg.source == "static"
        if self.static:
            self.logits = nn.Parameter(torch.zeros(groups, width))
        elif cfg.rank:
            self.down = nn.Linear(d_model, groups * cfg.rank, bias=False)
            self.up = PerHeadLinear(groups, cfg.rank, width, bias=cfg.bias)
        else:
            self.proj = nn.Linear(d_model, groups * width, bias=cfg.bias)

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """Normal(0, std) weights, zero biases, zero static logits."""
        if self.static:
            nn.init.zeros_(self.logits)
            return
        for linear in ((self.down, self.up) if self.rank else (self.proj,)):
            _reset_linear(linear, std)

    @torch.no_grad()
    def init_identity(self, logit: float, std: float) -> None:
        """Make the logits the constant ``logit`` (the last map zero, its bias ``logit``;
        without a bias only 0 is reachable); a low-rank gate's inner map stays random."""
        if self.static:
            self.logits.fill_(logit)
            return
        last = self.up if self.rank else self.proj
        if self.rank:
            nn.init.normal_(self.down.weight, 0.0, std)
        last.weight.zero_()
        if last.bias is not None:
            last.bias.fill_(logit)

    @property
    def linear(self) -> nn.Linear | None:
        """The full-rank ``X W`` projection, which a caller may fuse into its own matmul
        (then it passes the product to ``forward`` as ``projected``); None otherwise."""
        return None if self.static or self.rank else self.proj

    def forward(self, x_BTC: torch.Tensor, projected: torch.Tensor | None = None) -> torch.Tensor:
        if self.static:
            return self.logits[None, None]
        B, T, _ = x_BTC.shape
        if self.rank:
            inner = F.silu(self.down(x_BTC)).view(B, T, self.groups, self.rank)
            return self.up(inner)
        flat = self.proj(x_BTC) if projected is None else projected
        return flat.view(B, T, self.groups, self.width)

    def flops(self, n_tokens: int) -> int:
        if self.static:
            return 0
        if self.rank:
            down = 2 * self.down.weight.numel() * n_tokens
            return down + self.groups * self.rank * n_tokens + self.up.flops(n_tokens)
        return 2 * self.proj.weight.numel() * n_tokens


class HLogits(nn.Module):
    """HyGA H-gate logits from each head's own output: ``SiLU(H_i W_i^d) W_i^u``."""

    def __init__(self, groups: int, dim: int, inner: int, width: int):
        super().__init__()
        self.down = PerHeadLinear(groups, dim, inner)
        self.up = PerHeadLinear(groups, inner, width)

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        self.down.reset_parameters(std)
        self.up.reset_parameters(std)

    @torch.no_grad()
    def init_identity(self, std: float) -> None:
        """Logits 0: the inner map random, the outer one zero."""
        nn.init.normal_(self.down.weight, 0.0, std)
        self.up.weight.zero_()

    def forward(self, y_BTGD: torch.Tensor) -> torch.Tensor:
        return self.up(F.silu(self.down(y_BTGD)))

    def flops(self, n_tokens: int) -> int:
        inner = self.down.weight.shape[0] * self.down.weight.shape[2]
        return self.down.flops(n_tokens) + inner * n_tokens + self.up.flops(n_tokens)


class CrossHeadGate(nn.Module):
    """HyGA C-gate: ``c = concat(H_1..H_G) W_c``; head i is scaled by ``sigmoid(c_i)``."""

    def __init__(self, groups: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(groups * dim, groups, bias=False)
        self.score = GateScore("sigmoid")

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        _reset_linear(self.proj, std)

    @torch.no_grad()
    def init_identity(self, std: float) -> None:
        """Logits 0: every head scaled by sigmoid(0) = 1/2."""
        self.proj.weight.zero_()

    def logits(self, y_BTGD: torch.Tensor) -> torch.Tensor:
        """Per-head logits (B, T, G, 1)."""
        B, T, G, D = y_BTGD.shape
        return self.proj(y_BTGD.reshape(B, T, G * D)).view(B, T, G, 1)

    def forward(self, y_BTGD: torch.Tensor) -> torch.Tensor:
        return self.score(self.logits(y_BTGD))

    def flops(self, n_tokens: int) -> int:
        return (2 * self.proj.weight.numel() + self.proj.out_features) * n_tokens


class Gate(nn.Module):
    """Gates a tensor Y (B, T, G, D) given the layer input X (B, T, d_model).

    ``Y' = combine(Y, act(xlogit [+ hlogit]))`` then ``* sigmoid(c)`` when the C-gate is on;
    with ``fusion='multiply'`` the X and H scores are separate sigmoids multiplied.
    """

    def __init__(self, cfg: GateConfig, d_model: int, groups: int, dim: int):
        super().__init__()
        self.cfg = cfg
        self.groups, self.dim = groups, dim
        width = 1 if cfg.granularity == "headwise" else dim
        self.x = None if cfg.source == "none" else XLogits(cfg, d_model, 1 if cfg.shared else groups, width)
        self.h = HLogits(groups, dim, cfg.h_dim, width) if cfg.h_dim else None
        self.score = GateScore(cfg.activation)
        separate = cfg.fusion == "multiply" and self.x is not None and self.h is not None
        self.h_score = GateScore(cfg.activation) if separate else None
        self.c = CrossHeadGate(groups, dim) if cfg.cross_head else None

    def parts(self) -> list[nn.Module]:
        """The parameterised parts, in registration order: X-logits, H-logits, C-gate."""
        return [p for p in (self.x, self.h, self.c) if p is not None]

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """A fresh gate: Normal(0, std) weights, zero biases and static logits."""
        for part in self.parts():
            part.reset_parameters(std)

    @torch.no_grad()
    def init_identity(self, std: float) -> None:
        """Make every score a constant: logits 0, or the logit where the activation is 1 for a
        multiplied SiLU/identity gate with a bias. The caller undoes the constant."""
        logit = identity_logit(self.cfg)
        if self.x is not None:
            self.x.init_identity(logit, std)
        for part in (self.h, self.c):
            if part is not None:
                part.init_identity(std)

    @property
    def is_sigmoid_product(self) -> bool:
        """True when the gate is ``Y * sigmoid(logits)`` with one logit tensor (no separate H
        sigmoid), times ``sigmoid(C-gate logits)`` with a C-gate: the form
        ``ops.gated_linear`` fuses with the output projection."""
        c = self.cfg
        return (c.activation == "sigmoid" and c.combine == "multiply"
                and self.h_score is None and (self.x is not None or self.h is not None))

    @property
    def score_modules(self) -> list[nn.Module]:
        """The modules whose outputs are gate scores (what analysis hooks)."""
        return [m for m in (self.score, self.h_score, self.c.score if self.c is not None else None) if m is not None]

    def logits(self, y_BTGD: torch.Tensor, x_BTC: torch.Tensor,
               x_projected: torch.Tensor | None = None) -> torch.Tensor | None:
        """The X-gate logits plus the H-gate logits (additive fusion), or None if neither.
        ``x_projected`` is ``X W`` when the caller computed it in a fused matmul."""
        x_logits = self.x(x_BTC, x_projected) if self.x is not None else None
        h_logits = self.h(y_BTGD) if self.h is not None else None
        if x_logits is None or h_logits is None:
            return x_logits if h_logits is None else h_logits
        return x_logits + h_logits

    def forward(self, y_BTGD: torch.Tensor, x_BTC: torch.Tensor,
                x_projected: torch.Tensor | None = None) -> torch.Tensor:
        out = y_BTGD
        if self.h_score is not None:  # multiplicative fusion: two separate sigmoids
            scores = self.score(self.x(x_BTC, x_projected)) * self.h_score(self.h(y_BTGD))
        else:
            logits = self.logits(y_BTGD, x_BTC, x_projected)
            scores = self.score(logits) if logits is not None else None
        if scores is not None:
            scores = scores.to(y_BTGD.dtype)
            out = out * scores if self.cfg.combine == "multiply" else out + scores
        if self.c is not None:
            out = out * self.c(y_BTGD).to(out.dtype)
        return out

    def flops(self, n_tokens: int) -> int:
        """Forward FLOPs for ``n_tokens`` tokens: logit projections, activations, combine."""
        width = 1 if self.cfg.granularity == "headwise" else self.dim
        n_scores = self.groups * width * n_tokens
        total = n_scores + self.groups * self.dim * n_tokens  # activation + combine
        for part in (self.x, self.h, self.c):
            total += part.flops(n_tokens) if part is not None else 0
        if self.h is not None:
            total += n_scores  # fusion
        if self.c is not None:
            total += self.groups * self.dim * n_tokens
        return total


class HeadTransform(nn.Module):
    """A non-gate non-linearity on each head's SDPA output: per-head RMSNorm or SiLU."""

    def __init__(self, kind: str, dim: int, eps: float):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(dim, eps=eps) if kind == "rmsnorm" else None

    def forward(self, y_BTHD: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            return self.norm(y_BTHD)
        return F.silu(y_BTHD) if self.kind == "silu" else y_BTHD
