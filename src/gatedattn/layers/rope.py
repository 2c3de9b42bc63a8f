"""Rotary position embedding, with partial rotation and scaling for extrapolation.

The rotation uses the "rotate half" channel layout of HuggingFace Llama/Qwen models:
channel ``j`` pairs with channel ``j + rot/2`` inside the first ``rot`` channels of a
head; the remaining channels pass through unrotated.
"""

from __future__ import annotations

import math

import torch

from gatedattn.layers.config import RopeConfig


def rope_frequencies(cfg: RopeConfig, rot_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (rot_dim/2,) and the attention scaling of ``cfg``.

    ``linear`` divides positions by ``factor``; ``ntk`` raises the base to
    ``theta * factor ** (rot_dim / (rot_dim - 2))``; ``yarn`` interpolates only the
    low-frequency channels (ramp between ``beta_slow`` and ``beta_fast`` rotations
    over ``original_max_len``) and scales logits by ``0.1 ln(factor) + 1``.
    """
    half = torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim
    theta = cfg.theta
    if cfg.scaling == "ntk" and cfg.factor > 1 and rot_dim > 2:
        theta = theta * cfg.factor ** (rot_dim / (rot_dim - 2))
    inv_freq = 1.0 / (theta**half)
    mscale = 1.0
    if cfg.scaling == "linear":
        inv_freq = inv_freq / cfg.factor
    elif cfg.scaling == "yarn" and cfg.factor > 1:
        inv_freq, mscale = _yarn(cfg, rot_dim, inv_freq)
    return inv_freq.float(), mscale


def _yarn(cfg: RopeConfig, rot_dim: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, float]:
    def dim_for(rotations: float) -> float:
        return rot_dim * math.log(cfg.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(cfg.theta))

    low = max(math.floor(dim_for(cfg.beta_fast)), 0)
    high = min(math.ceil(dim_for(cfg.beta_slow)), rot_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1.0 - ramp  # 1: keep the original frequency (high-frequency channels)
    inv_freq = inv_freq / cfg.factor * (1 - extrapolate) + inv_freq * extrapolate
    return inv_freq, 0.1 * math.log(cfg.factor) + 1.0


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, mscale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (..., T, rot_dim) for integer ``positions`` (..., T)."""
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # (..., T, rot/2)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if mscale != 1.0:  # (a product by 1.0 would change nothing)
        cos, sin = cos * mscale, sin * mscale
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x_BTHD: torch.Tensor, cos_BTR: torch.Tensor, sin_BTR: torch.Tensor) -> torch.Tensor:
    """Rotate the first R channels of every head of ``x`` (B, T, H, D)."""
    rot = cos_BTR.shape[-1]
    if rot == 0:
        return x_BTHD
    cos, sin = cos_BTR[..., None, :], sin_BTR[..., None, :]  # broadcast over heads
    whole = rot == x_BTHD.shape[-1]  # every channel rotates: no slices (nor their backward copies)
    x_rot = x_BTHD if whole else x_BTHD[..., :rot]
    x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
    rotated = x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return rotated if whole else torch.cat((rotated, x_BTHD[..., rot:]), dim=-1)


class Rotary(torch.nn.Module):
    """RoPE for ``rot_dim`` channels per head; holds the inverse frequencies as a buffer."""

    def __init__(self, cfg: RopeConfig, rot_dim: int):
        super().__init__()
        self.cfg = cfg
        self.rot_dim = rot_dim
        inv_freq, self.mscale = self._frequencies()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _frequencies(self) -> tuple[torch.Tensor, float]:
        """The inverse frequencies (rot_dim / 2,) and the attention scale of the config."""
        return rope_frequencies(self.cfg, self.rot_dim) if self.rot_dim else (torch.zeros(0), 1.0)

    def make_buffers(self, device: torch.device | str = "cpu") -> None:
        """The frequency buffer made anew on ``device`` (a module built on the meta device
        holds none: it is computed, never loaded)."""
        self.inv_freq = self._frequencies()[0].to(device)

    def cos_sin(self, positions_BT: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions_BT, self.inv_freq, self.mscale, dtype)


class RopeTables:
    """The cos/sin tables of one forward's ``positions``, computed once and shared by every
    layer whose RoPE is the same (config, rotated channels, frequency buffer's dtype and
    device) -- as transformers' Llama computes them once per forward, not per layer. A
    layer with another RoPE (``Attention.with_rope``) gets its own tables."""

    def __init__(self, positions: torch.Tensor):
        self.positions = positions
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotary.cos_sin(positions, dtype)``, from the shared tables when ``positions``
        are this forward's."""
        cfg = getattr(rotary, "cfg", None)
        if positions is not self.positions or not isinstance(cfg, RopeConfig):
            return rotary.cos_sin(positions, dtype)
        key = (type(rotary), cfg, rotary.rot_dim, rotary.inv_freq.dtype, rotary.inv_freq.device, rotary.mscale, dtype)
        tables = self._tables.get(key)
        if tables is None:
            tables = self._tables[key] = rotary.cos_sin(positions, dtype)
        return tables
