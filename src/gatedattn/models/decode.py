"""Decoding over a static KV cache, one compiled step for every token.

``GatedLM.generate`` runs the prompt eagerly into a ``KVCache`` whose buffers hold the
whole decoding (``capacity``, rounded up to :data:`CAPACITY_STEP` so that nearby lengths
share one compiled step). Each later token is one call of :func:`static_step`: every layer
writes its key and value into column ``column`` of its buffers (``index_copy_`` with a
tensor index) and into the buffers' last column, and attends over all of them: the query
stands at the last column (``length = capacity - 1`` for the causal rule), where it sees
its own key, and ``key_mask`` shows it the earlier columns of its row's tokens (not the
columns not yet written, nor a padded row's padding, nor ``column`` itself, which it
already sees at the last column). Nothing in the step depends on how many
tokens came before as a Python number, so its shapes are fixed and ``torch.compile``
compiles it once per (batch, capacity, precision) and reuses it for every token.
:class:`StaticColumn` is the cache a layer sees in that step (``length`` and ``update``,
the interface ``Attention`` reads).

The compile pays back only over many tokens (on a 2-core CPU it takes tens of seconds);
``generate(compile="auto")`` compiles where the new tokens reach
:data:`AUTO_MIN_TOKENS` (:data:`AUTO_MIN_TOKENS_BATCHED` for more than two sequences; see
``docs/benchmarks/decode.md`` for how they were measured), else decodes eagerly.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.layers.cache import KVCache
from gatedattn.layers.packing import apply_linear
from gatedattn.layers.rope import RopeTables
from gatedattn.ops.row_linear import MAX_ROWS, RowProducts

CAPACITY_STEP = 128  # static buffers hold a multiple of this many positions
# new tokens (steps) from which compile="auto" compiles, above the break-evens measured on
# SmolLM2-135M from a cold compile (docs/benchmarks/decode.md): a decoding of at most
# row_linear.MAX_ROWS sequences, whose products the compiled step runs at the memory's speed
# (1,189-2,787 tokens over three runs of each precision), and a larger batch, where compiling
# saves mostly the calls between the products (3,339 and 3,568 in bf16 at batch 4)
AUTO_MIN_TOKENS = 4096
AUTO_MIN_TOKENS_BATCHED = 8192


def is_backend(name: Any) -> bool:
    """Whether ``name`` names a ``torch.compile`` backend."""
    return isinstance(name, str) and name in torch.compiler.list_backends(exclude_tags=())


def check_compile(compile: Any) -> None:
    """``compile``: ``"auto"``, True (inductor), False, or a ``torch.compile`` backend's name."""
    if compile is True or compile is False or compile == "auto" or is_backend(compile):
        return
    raise GatedAttnError(f"generate: compile={compile!r}; allowed: 'auto', True or False, or the name of a "
                         f"torch.compile backend (e.g. 'inductor', 'aot_eager')")


def compiles(compile: Any, batch: int, new_tokens: int, use_cache: bool) -> str | None:
    """The ``torch.compile`` backend ``generate`` decodes with over a static cache, or None
    (eager). ``"auto"`` counts the steps (the time a compiled step saves hardly grows with
    the batch) against the break-even of the batch's kind."""
    if not use_cache or new_tokens < 2 or compile is False:
        return None
    if compile == "auto":
        least = AUTO_MIN_TOKENS if batch <= MAX_ROWS else AUTO_MIN_TOKENS_BATCHED
        return "inductor" if new_tokens >= least else None
    return "inductor" if compile is True else compile


def static_capacity(positions: int) -> int:
    """Buffer columns for a decoding of ``positions`` positions: those and the query's own
    column, rounded up to a multiple of :data:`CAPACITY_STEP`."""
    return CAPACITY_STEP * math.ceil((positions + 1) / CAPACITY_STEP)


class StaticColumn:
    """One layer's cache inside :func:`static_step`: buffers of ``capacity`` positions
    (keys and values (B, Hkv, capacity, D), or MLA's latent (B, capacity, r) and RoPE key
    (B, capacity, 1, d)), the step's own entries written in place at ``column`` (a 1-element
    long tensor), for later steps, and at the last column, where this step's query sees them."""

    def __init__(self, buffers: tuple[torch.Tensor, torch.Tensor], column: torch.Tensor, latent: bool) -> None:
        self.buffers, self.column, self.latent = buffers, column, latent
        self.capacity = buffers[0].shape[1 if latent else 2]

    @property
    def length(self) -> int:
        return self.capacity - 1  # the query counts as the last column; the key mask does the rest

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._write(k, v, 2)

    def update_latent(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._write(latent, k_rope, 1)

    def _write(self, a: torch.Tensor, b: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        for buf, new in zip(self.buffers, (a, b)):
            new = new.to(buf.dtype)
            buf.index_copy_(dim, self.column, new)
            buf.narrow(dim, self.capacity - 1, 1).copy_(new)
        return self.buffers


def static_buffers(caches: list[KVCache], latent: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The full-capacity buffers the prompt's eager pass filled, one pair per layer, the
    columns after the prompt zeroed (a masked key's weight is zero, and zero times a stale
    NaN would not be)."""
    names, dim = (("latent", "k_rope"), 1) if latent else (("k", "v"), 2)
    out = []
    for cache in caches:
        pair = tuple(cache.allocated(n) for n in names)
        if any(b is None for b in pair) or pair[0].shape[dim] != cache.capacity:
            raise GatedAttnError("the static decoding step needs the prompt's cache in buffers of its capacity")
        for buf in pair:
            buf.narrow(dim, cache.length, cache.capacity - cache.length).zero_()
        out.append(pair)
    return out


def static_step(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, column: torch.Tensor,
                key_mask: torch.Tensor, buffers: list[tuple[torch.Tensor, torch.Tensor]],
                latent: bool) -> torch.Tensor:
    """The float logits (B, V) after one token per row: ``ids`` and ``positions`` (B, 1),
    written at ``column`` of every layer's ``buffers``; ``key_mask`` (B, capacity) True at
    the columns before ``column`` that hold the row's tokens."""
    # traced by the compiler, a one- or two-row product is a multiply and a sum, which
    # inductor makes one loop that reads the weight at the memory's speed (ops.row_linear)
    with RowProducts() if torch.compiler.is_compiling() else contextlib.nullcontext():
        rope = RopeTables(positions)
        x = model.embed(ids)
        if model.pos_embed is not None:
            x = x + model.pos_embed(positions)
        for block, pair in zip(model.blocks, buffers):
            x = block(x, positions=positions, cache=StaticColumn(pair, column, latent), key_mask=key_mask, rope=rope)
        return apply_linear(model.lm_head, model.norm(x))[:, -1].float()


@functools.cache
def compiled_step(backend: str = "inductor") -> Any:
    """:func:`static_step` compiled by ``backend`` (one graph, static shapes); dynamo keeps
    one entry per (model, batch, capacity, precision)."""
    return torch.compile(static_step, backend=backend, fullgraph=True, dynamic=False)


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """The next token (B,) of float ``logits`` (B, V): the argmax at ``temperature`` 0, else
    a draw from the softmax of ``logits / temperature`` over the ``top_k`` best."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def last_logits(model: torch.nn.Module, ids: torch.Tensor, caches: list[KVCache] | None,
                mask: torch.Tensor | None) -> torch.Tensor:
    """The float logits (B, V) at the last position of ``ids`` run through ``model.forward``."""
    return model(ids, caches=caches, attention_mask=mask, logits_to_keep=1)[:, -1].float()


class EagerSteps:
    """Each token through ``model.forward`` over a growing ``KVCache`` (or, without a
    cache, the whole sequence again)."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int, use_cache: bool,
                 attention_mask: torch.Tensor | None) -> None:
        self.model, self.use_cache, self.mask = model, use_cache, attention_mask
        self.caches = model.new_cache(ids.shape[1] + max_new_tokens) if use_cache else None
        self.seq = ids

    def first(self) -> torch.Tensor:
        return last_logits(self.model, self.seq, self.caches, self.mask)

    def next(self, nxt: torch.Tensor) -> torch.Tensor:
        self.seq = torch.cat((self.seq, nxt[:, None]), dim=1)
        if self.mask is not None:
            self.mask = torch.cat((self.mask, self.mask.new_ones(self.mask.shape[0], 1)), dim=1)
        return last_logits(self.model, nxt[:, None] if self.use_cache else self.seq, self.caches, self.mask)


class StaticSteps:
    """The prompt eagerly into full-capacity buffers, then each token through one
    :func:`compiled_step` call of ``backend`` (:func:`static_step` itself where None)."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int,
                 attention_mask: torch.Tensor | None, backend: str | None = "inductor") -> None:
        B, T = ids.shape
        self.model, self.ids, self.mask = model, ids, attention_mask
        self.capacity = static_capacity(T + max_new_tokens)
        self.caches = model.new_cache(self.capacity)
        self.latent = bool(model.blocks[0].attn.caches_latent)
        self.key_mask = torch.zeros(B, self.capacity, dtype=torch.bool, device=ids.device)
        self.key_mask[:, :T] = True if attention_mask is None else attention_mask.bool()
        self.column = T
        # the next token's position: each row's count of real tokens (eager's cumsum rule)
        self.positions = self.key_mask[:, :T].sum(-1, keepdim=True)
        self.step = compiled_step(backend) if backend is not None else static_step

    def first(self) -> torch.Tensor:
        logits = last_logits(self.model, self.ids, self.caches, self.mask)
        self.buffers = static_buffers(self.caches, self.latent)
        return logits

    def next(self, nxt: torch.Tensor) -> torch.Tensor:
        column = torch.tensor([self.column], device=nxt.device)
        logits = self.step(self.model, nxt[:, None], self.positions, column, self.key_mask, self.buffers, self.latent)
        self.key_mask[:, self.column] = True
        self.column += 1
        self.positions = self.positions + 1
        return logits


def decode_tokens(steps: EagerSteps | StaticSteps, ids: torch.Tensor, max_new_tokens: int, temperature: float,
                  top_k: int | None, generator, eos_token_id: int | None) -> torch.Tensor:
    """``ids`` followed by up to ``max_new_tokens`` sampled tokens (after ``eos_token_id``
    in a row, that token again; the loop ends once every row has ended)."""
    out = ids
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    logits = steps.first() if max_new_tokens else None
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)
        if eos_token_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_token_id), nxt)
            finished |= nxt == eos_token_id
        out = torch.cat((out, nxt[:, None]), dim=1)
        if i + 1 == max_new_tokens or (eos_token_id is not None and finished.all()):
            break
        logits = steps.next(nxt)
    return out
