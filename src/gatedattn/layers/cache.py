"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch

from gatedattn.infra.errors import GatedAttnError


class KVCache:
    """What one attention layer keeps of the positions it has seen.

    GQA/MHA layers keep keys (B, Hkv, T, Dqk) and values (B, Hkv, T, Dv) (``update``).
    MLA layers keep the compressed latent (B, T, kv_rank) and the RoPE key part shared by
    all heads (B, T, 1, rope_dim) (``update_latent``) and expand them on use: the point of
    MLA is this smaller cache. Each update appends the new step and returns everything
    cached; ``length`` is the number of positions already seen (the next query's offset).

    Without ``capacity`` each update concatenates (the cache holds exactly what it has
    seen). With ``capacity`` (the positions a decoding will reach, e.g. prompt plus new
    tokens) the first update allocates buffers of that many positions and every update
    writes its step into them in place, returning views of the filled part; a longer
    decoding grows them (doubling). Steps that carry gradients always concatenate, so that
    nothing autograd saved is ever written over.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise GatedAttnError(f"KVCache capacity={capacity!r} must be an int >= 1 (positions), or None to grow "
                                 f"by concatenation")
        self.capacity = capacity
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.latent: torch.Tensor | None = None
        self.k_rope: torch.Tensor | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # name -> preallocated storage (with capacity)

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
        self.k = self._append("k", self.k, k, 2)
        self.v = self._append("v", self.v, v, 2)
        return self.k, self.v

    def update_latent(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.latent = self._append("latent", self.latent, latent, 1)
        self.k_rope = self._append("k_rope", self.k_rope, k_rope, 1)
        return self.latent, self.k_rope

    def _append(self, name: str, held: torch.Tensor | None, new: torch.Tensor, dim: int) -> torch.Tensor:
        """``held`` followed by ``new`` along ``dim``: written in place into the buffer
        ``name`` when the cache has a capacity, else concatenated."""
        if self.capacity is None or new.requires_grad or (held is not None and held.requires_grad):
            self._buffers.pop(name, None)
            return new if held is None else torch.cat((held, new), dim=dim)
        seen = 0 if held is None else held.shape[dim]
        end = seen + new.shape[dim]
        buf = self._buffers.get(name)
        if not _fits(buf, held, new, dim, end):
            # a new buffer: the first step, a longer decoding, or a held tensor not (any more) in the buffer
            buf = self._buffers[name] = self._grown(buf, held, new, dim, end)
        buf.narrow(dim, seen, new.shape[dim]).copy_(new)
        return buf.narrow(dim, 0, end)

    def _grown(self, buf: torch.Tensor | None, held: torch.Tensor | None, new: torch.Tensor, dim: int,
               end: int) -> torch.Tensor:
        """A buffer for at least ``end`` positions (the capacity, or double the old one)
        holding ``held``, in the dtype concatenation would give."""
        size = list(new.shape)
        size[dim] = max(self.capacity, end, 2 * buf.shape[dim] if buf is not None and held is not None else 0)
        grown = new.new_empty(size, dtype=_dtype(held, new))
        if held is not None and held.shape[dim]:
            grown.narrow(dim, 0, held.shape[dim]).copy_(held)
        return grown

    def allocated(self, name: str) -> torch.Tensor | None:
        """The whole buffer of ``name`` (``k``, ``v``, ``latent``, ``k_rope``) a cache with a
        capacity writes its steps into (the held tensor is a view of its first positions),
        or None where there is none."""
        return self._buffers.get(name)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache holds (for measuring its size)."""
        return [t for t in (self.k, self.v, self.latent, self.k_rope) if t is not None]

    def nbytes(self) -> int:
        """Bytes of the positions cached (a cache with a capacity allocates its buffers whole)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
        if self.latent is not None:
            self.latent, self.k_rope = self.latent[:, :length], self.k_rope[:, :length]


def _dtype(held: torch.Tensor | None, new: torch.Tensor) -> torch.dtype:
    if held is None or held.dtype == new.dtype:
        return new.dtype
    return torch.promote_types(held.dtype, new.dtype)


def _fits(buf: torch.Tensor | None, held: torch.Tensor | None, new: torch.Tensor, dim: int, end: int) -> bool:
    """Whether ``buf`` starts with ``held`` and takes ``new`` after it as it is."""
    if buf is None or held is None or held.data_ptr() != buf.data_ptr():
        return False
    if buf.shape[dim] < end or buf.dtype != _dtype(held, new) or buf.device != new.device:
        return False
    return all(a == b for i, (a, b) in enumerate(zip(buf.shape, new.shape)) if i != dim)
