"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys (B, Hkv, T, Dqk) and values (B, Hkv, T, Dv) of one attention layer.

    ``update`` appends the new step's keys and values and returns everything cached;
    ``length`` is the number of positions already seen (the next query's offset).
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
