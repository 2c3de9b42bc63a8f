"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """What one attention layer keeps of the positions it has seen.

    GQA/MHA layers keep keys (B, Hkv, T, Dqk) and values (B, Hkv, T, Dv) (``update``).
    MLA layers keep the compressed latent (B, T, kv_rank) and the RoPE key part shared by
    all heads (B, T, 1, rope_dim) (``update_latent``) and expand them on use: the point of
    MLA is this smaller cache. Each update appends the new step and returns everything
    cached; ``length`` is the number of positions already seen (the next query's offset).
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.latent: torch.Tensor | None = None
        self.k_rope: torch.Tensor | None = None

    @property
    def length(self) -> int:
        if self.latent is not None:
            return self.latent.shape[1]
        return 0 if self.k is None else self.k.shape[2]

    @property
    def batch_size(self) -> int | None:
        """The batch the cache holds (None while empty)."""
        held = self.latent if self.latent is not None else self.k
        return None if held is None else held.shape[0]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def update_latent(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.latent = latent if self.latent is None else torch.cat((self.latent, latent), dim=1)
        self.k_rope = k_rope if self.k_rope is None else torch.cat((self.k_rope, k_rope), dim=1)
        return self.latent, self.k_rope

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache holds (for measuring its size)."""
        return [t for t in (self.k, self.v, self.latent, self.k_rope) if t is not None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
        if self.latent is not None:
            self.latent, self.k_rope = self.latent[:, :length], self.k_rope[:, :length]
