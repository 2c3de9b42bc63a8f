"""Read a model's internals through hooks, one batch at a time, and restore it afterwards.

Two layers of API:

- :func:`hooked` is a context manager that runs every layer with a :class:`ProbeCore`
  (through ``Attention.with_core``) and registers forward hooks that hand tensors to
  callbacks: ``on_probs(layer, probs)`` with the attention probabilities (B, H, Tq, Tk) of
  one layer, ``on_values(layer, v)`` with the value states (B, Hkv, T, Dv) the layer's
  attention mixes (after the value projection and a g2 gate, before attention),
  ``on_hidden(layer, h)`` with the residual stream after the layer (B, T, C),
  ``on_gate(layer, name, scores)`` with the output of every ``GateScore`` of the layer's
  gate (``name`` is its path inside the gate: ``score``, ``h_score``, ``c.score``).
  Callbacks see each tensor while the layer runs and must not keep it, so at most one
  layer's batch of probabilities exists at a time.
- :class:`Probe` is the accumulator ``analyze`` uses: it feeds those tensors to the
  streaming metrics of :mod:`gatedattn.analysis.metrics` and keeps only per-layer sums.

Nothing here edits model code or parameters, or assigns attributes of a layer. On exit
(also after an error) the hooks are removed and each layer's own core is back, so the
model's outputs are those of before. Inside the context the probabilities come from the reference core (float32
softmax), so logits may differ from the fast kernel's in the last bits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gatedattn.analysis.metrics import (AttentionStats, FirstPositionNorms, GateStats, TopActivations,
                                        massive_activation)
from gatedattn.layers.attention import Attention
from gatedattn.infra.errors import GatedAttnError
from gatedattn.layers.gates import GateScore
from gatedattn.ops.reference import attention_probs_reference

__all__ = ["LayerActivations", "Probe", "ProbeCore", "attention_layers", "hooked"]


class ProbeCore(nn.Module):
    """An attention core for analysis: the reference core, with its probabilities
    (B, H, Tq, Tk) passed through ``self.probs`` and its value states (B, Hkv, Tk, Dv)
    through ``self.values`` (identity modules) so that forward hooks can read them. Use it
    with ``Attention.with_core``."""

    def __init__(self) -> None:
        super().__init__()
        self.probs = nn.Identity()
        self.values = nn.Identity()

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        v = self.values(v)
        probs = self.probs(attention_probs_reference(q, k, sink, q_offset=q_offset, scale=scale))
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (probs @ v.float()).to(q.dtype)

ProbsCallback = Callable[[int, Tensor], None]
ValuesCallback = Callable[[int, Tensor], None]
HiddenCallback = Callable[[int, Tensor], None]
GateCallback = Callable[[int, str, Tensor], None]


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks of a ``GatedLM``-shaped model (``model.blocks[i].attn`` is an ``Attention``)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(isinstance(getattr(b, "attn", None), Attention) for b in blocks):
        raise GatedAttnError(
            f"{type(model).__name__} is not a GatedLM-shaped model: analysis needs "
            f"model.blocks[i].attn to be gatedattn.Attention"
        )
    return list(blocks)


@contextlib.contextmanager
def hooked(
    model: nn.Module,
    *,
    on_probs: ProbsCallback | None = None,
    on_hidden: HiddenCallback | None = None,
    on_gate: GateCallback | None = None,
    on_values: ValuesCallback | None = None,
) -> Iterator[nn.Module]:
    """Run the body with analysis hooks on ``model``; see the module docstring.

    Layers run with a ``ProbeCore`` only when ``on_probs`` or ``on_values`` is given.
    Yields the model.
    """
    blocks = attention_layers(model)
    handles: list[torch.utils.hooks.RemovableHandle] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [h.remove() for h in handles])
        for i, block in enumerate(blocks):
            attn: Attention = block.attn
            if on_probs is not None or on_values is not None:
                probe = stack.enter_context(attn.with_core(ProbeCore()))
                if on_probs is not None:
                    handles.append(probe.probs.register_forward_hook(_output_hook(i, on_probs)))
                if on_values is not None:
                    handles.append(probe.values.register_forward_hook(_output_hook(i, on_values)))
            if on_hidden is not None:
                handles.append(block.register_forward_hook(_output_hook(i, on_hidden)))
            if on_gate is not None and attn.gate is not None:
                handles += _gate_hooks(block, i, on_gate)
        yield model


def _gate_hooks(block: nn.Module, layer: int, on_gate: GateCallback) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks on every ``GateScore`` of the block's gate. A score's shape may broadcast over
    tokens (a static gate is (1, 1, G, W)); the attention input (the pre-norm's output)
    gives (B, T) so that every token's score counts once."""
    shape: dict[str, tuple[int, int]] = {}
    handles = [block.attn_norm.register_forward_hook(_shape_hook(shape))]
    for name, module in block.attn.gate.named_modules():
        if isinstance(module, GateScore):
            handles.append(module.register_forward_hook(_gate_hook(layer, name, shape, on_gate)))
    return handles


def _output_hook(layer: int, fn: Callable[[int, Tensor], None]):
    """A forward hook that hands the module's output (detached) to ``fn(layer, output)``."""
    def hook(module, inputs, output):
        fn(layer, output.detach())

    return hook


def _shape_hook(shape: dict[str, tuple[int, int]]):
    def hook(module, inputs, output):
        shape["BT"] = (output.shape[0], output.shape[1])

    return hook


def _gate_hook(layer: int, name: str, shape: dict[str, tuple[int, int]], fn: GateCallback):
    def hook(module, inputs, output):
        scores = output.detach()
        B, T = shape.get("BT", scores.shape[:2])
        if scores.dim() >= 2 and scores.shape[:2] != (B, T):
            scores = scores.expand(B, T, *scores.shape[2:])
        fn(layer, name, scores)

    return hook


# --------------------------------------------------------------------------- accumulator


class LayerActivations:
    """Streaming M-Act of one layer: max |h| over all batches (and where it is), and the
    median |h| of each batch. A batch's median is exact; over several batches the layer's
    median is the median of the batch medians (the exact median would need every value)."""

    def __init__(self) -> None:
        self.max_abs = -math.inf
        self.where: tuple[int, int, int] | None = None  # (sequence, position, channel)
        self.value = math.nan  # the signed h at ``where``
        self.medians: list[float] = []
        self.sequences = 0

    def update(self, hidden: Tensor) -> None:
        m = massive_activation(hidden)
        if m["max_abs"] > self.max_abs or self.where is None:
            self.max_abs = m["max_abs"]
            self.where = (self.sequences + m["batch"], m["position"], m["channel"])
            self.value = float(hidden[m["batch"], m["position"], m["channel"]])
        self.medians.append(m["median_abs"])
        self.sequences += hidden.shape[0]

    @property
    def median_abs(self) -> float:
        return float(np.median(self.medians)) if self.medians else math.nan

    @property
    def ratio(self) -> float:
        med = self.median_abs
        return self.max_abs / med if med > 0 else math.inf


class Probe:
    """Per-layer statistics of a model over many batches, collected through :func:`hooked`.

    ``with Probe(model) as probe: model(ids)`` (any number of forward passes), then read:

    - ``attention[i]``: an ``AttentionStats`` (F-Attn, sink alpha per head);
    - ``sink_mass(i)``: mean probability on the learnable sink (None without one), i.e.
      the mass missing from each row of the probabilities, averaged over (B, H, query);
    - ``activations[i]``: a ``LayerActivations`` (M-Act and its ratio to the median);
    - ``values[i]``: a ``FirstPositionNorms`` of the layer's value states, one group per KV
      head (the value drain at the first position);
    - ``residual[i]``: a ``FirstPositionNorms`` of the layer's residual-stream output, one
      group (the residual peak at the first position);
    - ``top_activations``: a ``TopActivations`` over all layers (the largest |h|, with the
      channel, layer and position that carry them; ``n_top`` of them);
    - ``gates[i]``: ``{score name: GateStats}`` (empty for an ungated layer);
    - ``maps[i]``: the head-averaged attention map of the first sequence seen, cropped to
      ``map_size`` x ``map_size`` (float32 numpy), for the layers in ``map_layers``.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        attention: bool = True,
        hidden: bool = True,
        gates: bool = True,
        values: bool = True,
        map_layers: Sequence[int] = (),
        map_size: int = 64,
        n_bins: int = 100,
        n_top: int = 5,
    ) -> None:
        self.model = model
        n_layers = len(attention_layers(model))
        bad = [i for i in map_layers if not 0 <= i < n_layers]
        if bad:
            raise GatedAttnError(f"layer {bad[0]} does not exist; the model has layers 0..{n_layers - 1}")
        self.n_layers = n_layers
        self.map_layers = tuple(map_layers)
        self.map_size = map_size
        self.n_bins = n_bins
        self._want = (attention, hidden, gates, values)
        self.attention = [AttentionStats() for _ in range(n_layers)]
        self._sink_sum = [0.0] * n_layers
        self._sink_count = [0] * n_layers
        self.has_sink = [attn.sink is not None for attn in (b.attn for b in model.blocks)]
        self.activations = [LayerActivations() for _ in range(n_layers)]
        self.values = [FirstPositionNorms() for _ in range(n_layers)]
        self.residual = [FirstPositionNorms() for _ in range(n_layers)]
        self.top_activations = TopActivations(n_top)
        self.gates: list[dict[str, GateStats]] = [{} for _ in range(n_layers)]
        self.maps: dict[int, np.ndarray] = {}
        self._ctx: contextlib.AbstractContextManager | None = None

    # context ---------------------------------------------------------------
    def __enter__(self) -> Probe:
        attention, hidden, gates, values = self._want
        self._ctx = hooked(
            self.model,
            on_probs=self._on_probs if attention else None,
            on_hidden=self._on_hidden if hidden else None,
            on_gate=self._on_gate if gates else None,
            on_values=self._on_values if values else None,
        )
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(*exc)

    # callbacks -------------------------------------------------------------
    def _on_probs(self, layer: int, probs: Tensor) -> None:
        self.attention[layer].update(probs)
        if self.has_sink[layer]:
            missing = (1.0 - probs.to(torch.float64).sum(dim=-1)).clamp_min(0.0)  # (B, H, Tq)
            self._sink_sum[layer] += float(missing.sum())
            self._sink_count[layer] += missing.numel()
        if layer in self.map_layers and layer not in self.maps:
            n = self.map_size
            self.maps[layer] = probs[0, :, :n, :n].float().mean(dim=0).cpu().numpy()

    def _on_values(self, layer: int, values: Tensor) -> None:
        self.values[layer].update(values)

    def _on_hidden(self, layer: int, hidden: Tensor) -> None:
        self.activations[layer].update(hidden)
        self.residual[layer].update(hidden[:, None])
        self.top_activations.update(layer, hidden)

    def _on_gate(self, layer: int, name: str, scores: Tensor) -> None:
        stats = self.gates[layer].get(name)
        if stats is None:
            stats = self.gates[layer][name] = GateStats(self.n_bins)
        stats.update(scores)

    # results ---------------------------------------------------------------
    def sink_mass(self, layer: int) -> float | None:
        """Mean probability on the learnable sink of ``layer``; None when it has none."""
        if not self.has_sink[layer]:
            return None
        count = self._sink_count[layer]
        return self._sink_sum[layer] / count if count else math.nan

    def layer_gate_stats(self, layer: int) -> GateStats | None:
        """All gate scores of one layer merged; None for an ungated layer."""
        if not self.gates[layer]:
            return None
        total = GateStats(self.n_bins)
        for stats in self.gates[layer].values():
            total.merge(stats)
        return total

    def model_gate_stats(self) -> GateStats | None:
        """All gate scores of all layers merged; None when no layer has a gate."""
        per_layer = [s for s in (self.layer_gate_stats(i) for i in range(self.n_layers)) if s is not None]
        if not per_layer:
            return None
        total = GateStats(self.n_bins)
        for stats in per_layer:
            total.merge(stats)
        return total

    def gate_stats_by_name(self) -> dict[str, GateStats]:
        """Gate scores of all layers merged per score name (``score``, ``h_score``, ``c.score``)."""
        out: dict[str, GateStats] = {}
        for layer in self.gates:
            for name, stats in layer.items():
                out.setdefault(name, GateStats(self.n_bins)).merge(stats)
        return out
