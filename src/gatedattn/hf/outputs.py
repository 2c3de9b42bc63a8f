"""Hidden states and attention probabilities of a ``GatedLM`` forward, as transformers
returns them for ``output_hidden_states`` / ``output_attentions``.

``recording(lm, hidden_states=..., attentions=...)`` is a context manager that collects,
for the forward passes inside it:

* hidden states, ``n_layers + 1`` tensors (B, T, d_model): the embedding output (what
  block 0 reads), the output of each block, and for the last block its output after the
  final norm -- what ``LlamaForCausalLM`` returns;
* attention probabilities, one (B, H, T, T_keys) tensor per layer, from the reference
  core (explicit scores and softmax: a fused kernel never forms them). A layer whose core
  is already the reference one (``layers.core.ReferenceCore``: the wrapper's ``"eager"``
  attention) hands out the probabilities it computes anyway; any other layer runs on a
  ``RecordingCore`` for the body, so its outputs are the reference path's.

Hooks and cores are installed on entry and removed on exit; activation checkpointing
recomputes blocks in backward, after the context has closed, and records nothing then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from gatedattn.layers.core import ReferenceCore


class RecordingCore(ReferenceCore):
    """The reference attention core, appending each call's probabilities to ``calls``."""

    def __init__(self, calls: list[torch.Tensor]):
        super().__init__(probs=calls)

    @property
    def calls(self) -> list[torch.Tensor]:
        return self.probs


@dataclass
class Recorded:
    """What one ``recording`` collected: tuples, or None for what was not asked for."""

    hidden: list[torch.Tensor] | None = None
    probs: list[list[torch.Tensor]] | None = None
    _final: list[torch.Tensor] = field(default_factory=list)

    @property
    def hidden_states(self) -> tuple[torch.Tensor, ...] | None:
        if self.hidden is None:
            return None
        states = list(self.hidden)
        if self._final and len(states) > 1:
            states[-1] = self._final[-1]
        return tuple(states)

    @property
    def attentions(self) -> tuple[torch.Tensor, ...] | None:
        if self.probs is None:
            return None
        return tuple(layer[-1] for layer in self.probs if layer)


@contextlib.contextmanager
def recording(lm: nn.Module, *, hidden_states: bool = False, attentions: bool = False) -> Iterator[Recorded]:
    """Collect the hidden states and/or attention probabilities of ``lm`` (a ``GatedLM``)
    for the forward passes inside the body (the last pass's, when there are several)."""
    out = Recorded(hidden=[] if hidden_states else None, probs=[[] for _ in lm.blocks] if attentions else None)
    with contextlib.ExitStack() as stack:
        if hidden_states:
            blocks = list(lm.blocks)

            def first(_module, args, kwargs):
                out.hidden.clear()
                out.hidden.append(args[0] if args else kwargs["x"])

            def each(_module, _args, output):
                out.hidden.append(output)

            def final(_module, _args, output):
                out._final.append(output)

            handles = [blocks[0].register_forward_pre_hook(first, with_kwargs=True)]
            handles += [b.register_forward_hook(each) for b in blocks]
            handles.append(lm.norm.register_forward_hook(final))
            for h in handles:
                stack.callback(h.remove)
        if attentions:
            for block, probs in zip(lm.blocks, out.probs):
                _record(stack, block.attn, probs)
        yield out


def _record(stack: contextlib.ExitStack, attn: nn.Module, probs: list[torch.Tensor]) -> None:
    """Collect ``attn``'s probabilities into ``probs`` until ``stack`` closes: from its own
    core when that is the reference one (nothing swapped), else from a ``RecordingCore``."""
    core = attn.core
    if isinstance(core, ReferenceCore) and core.probs is None:
        core.probs = probs
        stack.callback(setattr, core, "probs", None)
    else:
        stack.enter_context(attn.with_core(RecordingCore(probs)))
