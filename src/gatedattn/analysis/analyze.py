"""Measure a checkpoint: attention sinks, massive activations, gate scores, loss, extrapolation.

- :func:`analyze` runs a model over validation batches with :class:`~gatedattn.analysis.probe.Probe`
  attached and returns one JSON-serialisable dict of the docs/design.md section 4 metrics.
- :func:`extrapolate` measures validation loss at multiples of the training context, with
  plain RoPE and with NTK / YaRN scaling, by swapping each layer's ``rotary`` module for
  one built from a scaled ``RopeConfig`` (and putting the original back afterwards).
- :func:`load_any` loads any checkpoint the project reads: our own format first, then
  HuggingFace / official layouts through ``gatedattn.hf.load_model``.

Non-finite numbers (an undefined median ratio, a NaN loss) appear as ``None`` in the
results so that they stay strict JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatedattn.analysis.metrics import SINK_EPS, GateStats, sink_fraction, sink_fraction_per_layer
from gatedattn.analysis.probe import Probe, attention_layers
from gatedattn.analysis.result import AnalysisResult
from gatedattn.analysis.windows import FirstToken
from gatedattn.hf.load import load_model
from gatedattn.models.casts import FrozenCasts
from gatedattn.layers.config import RopeConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.fmt import finite_or_none, fmt_value
from gatedattn.models.lm import GatedLM
from gatedattn.train.metrics import ppl

__all__ = [
    "EXTRAPOLATION_METHODS",
    "analyze",
    "default_map_layers",
    "extrapolate",
    "extrapolation_curves",
    "format_analysis",
    "format_extrapolation",
    "load_any",
    "rope_for_method",
    "scaled_rope",
]

EXTRAPOLATION_METHODS = ("plain", "linear", "ntk", "yarn")


# --------------------------------------------------------------------------- loading


def load_any(directory: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The model at ``directory`` as a ``GatedLM`` on ``device``, read by the one loader,
    :func:`gatedattn.hf.load_model`: a gatedattn, HF Llama / Qwen2 / Qwen3, Qwen3-Next or
    official-layout directory, a GGUF file, or a directory holding one."""
    return load_model(directory, device=device)


# --------------------------------------------------------------------------- analyze


def default_map_layers(n_layers: int) -> list[int]:
    """First, middle and last layer (fewer when the model is shallower)."""
    return sorted({0, n_layers // 2, n_layers - 1})


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _check_batch(batch: Tensor, vocab_size: int | None) -> Tensor:
    if not isinstance(batch, Tensor) or batch.dim() != 2 or batch.shape[1] < 2 or batch.shape[0] < 1:
        shape = tuple(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
        raise GatedAttnError(f"a token batch must be a (B, T+1) tensor with T >= 1; got {shape}")
    if batch.dtype.is_floating_point or batch.dtype == torch.bool:
        raise GatedAttnError(f"a token batch must hold integer token ids; got dtype {batch.dtype}")
    if vocab_size is not None:
        lo, hi = int(batch.min()), int(batch.max())
        if lo < 0 or hi >= vocab_size:
            raise GatedAttnError(
                f"token id {hi if hi >= vocab_size else lo} is outside the model's vocabulary "
                f"[0, {vocab_size}); was the data tokenized with the model's tokenizer?"
            )
    return batch.long()


def _token_losses(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy per token, (B, T) float64; one row at a time, so that a large
    vocabulary needs one sequence's float32 logits beside the model's output."""
    rows = [F.cross_entropy(logits[b].float(), targets[b], reduction="none") for b in range(logits.shape[0])]
    return torch.stack(rows).double()


def _loss_sum(model: nn.Module, run, inputs: Tensor, targets: Tensor) -> float:
    """The batch's summed next-token cross-entropy. A ``GatedLM`` computes it with its LM head
    and loss fused (``forward(targets=...)``, ``ops.linear_cross_entropy``): no (B, T, V)
    logits and no separate log-softmax over them, which dominate at a large vocabulary
    (``docs/benchmarks/real-model.md``). Any other model through its logits. ``run`` calls
    the model (``FrozenCasts``)."""
    if isinstance(model, GatedLM):
        return float(run(inputs, targets=targets)) * targets.numel()  # the mean over every target
    return float(_token_losses(run(inputs), targets).sum())


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


_num = finite_or_none


def _nums(xs: Iterable[float | None]) -> list[float | None]:
    return [_num(x) for x in xs]


def _gate_summary(stats: GateStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    s = stats.summary()
    return {
        "mean": _num(s["mean"]),
        "frac_below_0.01": _num(s["frac_below_0.01"]),
        "frac_below_0.001": _num(s["frac_below_0.001"]),
        "count": int(s["count"]),
    }


def _histogram(stats: GateStats) -> dict[str, Any]:
    edges, counts = stats.histogram()
    return {
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
        "underflow": int(stats.underflow),
        "overflow": int(stats.overflow),
        "nan": int(stats.nan_count),
    }


def analyze(
    model: nn.Module,
    batches: Iterable[Tensor],
    *,
    layers_for_maps: Sequence[int] | None = None,
    eps: float = SINK_EPS,
    map_size: int = 64,
    n_bins: int = 100,
    first_token: FirstToken | None = None,
    n_top_channels: int = 5,
) -> AnalysisResult:
    """Run ``model`` (eval, no grad) over token batches (B, T+1) and measure it.

    Inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``. The model is read only through
    hooks and ``Attention.with_core`` (see :mod:`gatedattn.analysis.probe`) and is restored
    on return; its training mode is restored too. For sink figures use windows of one
    document each (:func:`gatedattn.analysis.windows.document_windows`): a separator token
    inside a window is a second sink.

    ``layers_for_maps``: layers whose head-averaged attention map (first sequence, first
    ``map_size`` queries and keys) is returned; default first, middle and last.
    ``first_token``: the :class:`~gatedattn.analysis.windows.FirstToken` the windows start
    with (recorded; with a ``bos`` / ``id`` mode every window must start with its id).
    ``n_top_channels``: how many model-wide largest activations ``m_act_channels`` lists.

    Returns an :class:`~gatedattn.analysis.result.AnalysisResult`: the run, attention on
    the first position (F-Attn, Sink^eps, a learnable sink's mass), massive activations
    and the channels that carry them, the first position's value and residual states,
    the gates' scores and the attention maps, each key documented where the type declares it.
    """
    blocks = attention_layers(model)
    n_layers = len(blocks)
    cfg = getattr(model, "cfg", None)
    vocab_size = getattr(cfg, "vocab_size", None)
    map_layers = default_map_layers(n_layers) if layers_for_maps is None else sorted(set(layers_for_maps))
    device = _model_device(model)
    if isinstance(n_top_channels, bool) or not isinstance(n_top_channels, int) or n_top_channels < 1:
        raise GatedAttnError(f"n_top_channels must be an integer >= 1, got {n_top_channels!r}")
    if first_token is not None and not isinstance(first_token, FirstToken):
        raise GatedAttnError(f"first_token must be a FirstToken (gatedattn.analysis.resolve_first_token) or None, "
                             f"got {type(first_token).__name__}")
    probe = Probe(model, map_layers=map_layers, map_size=map_size, n_bins=n_bins, n_top=n_top_channels)

    loss_sum, n_tokens, n_sequences = 0.0, 0, 0
    seq_lens: set[int] = set()
    starts: set[int] = set()
    run = FrozenCasts(model)  # under autocast the weights are cast once for every batch
    with _eval_mode(model), probe:
        for batch in batches:
            batch = _check_batch(batch, vocab_size)
            starts.update(_first_ids(batch, first_token, n_sequences))
            batch = batch.to(device)
            inputs, targets = batch[:, :-1], batch[:, 1:]
            loss_sum += _loss_sum(model, run, inputs, targets)
            n_tokens += targets.numel()
            n_sequences += batch.shape[0]
            seq_lens.add(inputs.shape[1])
    if n_tokens == 0:
        raise GatedAttnError("analyze got no batches to run")

    val_loss = loss_sum / n_tokens
    result: AnalysisResult = {
        "variant": getattr(cfg, "variant", type(model).__name__),
        "n_layers": n_layers,
        "n_heads": int(probe.attention[0].sink_scores().numel()),
        "seq_len": next(iter(seq_lens)) if len(seq_lens) == 1 else None,
        "n_sequences": n_sequences,
        "n_tokens": n_tokens,
        "val_loss": _num(val_loss),
        "val_ppl": _num(ppl(val_loss)),
        "first_token": _first_token_record(first_token, starts),
        "windows": {"count": n_sequences, "length": next(iter(seq_lens)) if len(seq_lens) == 1 else None},
        **_attention_results(probe, eps),
        **_activation_results(probe),
        **_first_position_results(probe),
    }
    result.update(_gate_results(probe))
    result["attention_maps"] = {
        str(i): [[round(float(p), 6) for p in row] for row in probe.maps[i]] for i in map_layers if i in probe.maps
    }
    return result


def _first_ids(batch: Tensor, first_token: FirstToken | None, seen: int) -> set[int]:
    """The ids at position 0 of ``batch``; with a ``bos`` / ``id`` first token, each must be its id."""
    ids = set(batch[:, 0].tolist())
    if first_token is not None and first_token.id is not None and ids != {first_token.id}:
        row = seen + int((batch[:, 0] != first_token.id).nonzero()[0, 0])
        raise GatedAttnError(f"window {row} starts with token {int(batch[row - seen, 0])}, not the first token "
                             f"{first_token.id} ({first_token.mode}) given to analyze")
    return ids


def _first_token_record(first_token: FirstToken | None, starts: set[int]) -> dict[str, Any]:
    if first_token is not None:
        return first_token.to_dict()
    return {"mode": "unspecified", "id": next(iter(starts)) if len(starts) == 1 else None}


def _first_position_results(probe: Probe) -> dict[str, Any]:
    acts = probe.activations
    per_layer = [{"layer": i, "channel": a.where[2], "position": a.where[1], "sequence": a.where[0],
                  "value": _num(a.value)} for i, a in enumerate(acts)]
    top = [{**entry, "value": _num(entry["value"])} for entry in probe.top_activations.top()]
    return {
        "value_drain_per_layer": _nums(v.overall() for v in probe.values),
        "value_drain_per_head": [_nums(v.per_group().tolist()) for v in probe.values],
        "residual_peak_per_layer": _nums(r.overall() for r in probe.residual),
        "m_act_channels": {"per_layer": per_layer, "top": top},
    }


def _attention_results(probe: Probe, eps: float) -> dict[str, Any]:
    n_layers = probe.n_layers
    alphas = [probe.attention[i].sink_scores() for i in range(n_layers)]
    f_per_layer = [probe.attention[i].first_token_attention() for i in range(n_layers)]
    sink_masses = [probe.sink_mass(i) for i in range(n_layers)]
    with_sink = [m for m in sink_masses if m is not None]
    has_sink = bool(with_sink)
    return {
        "f_attn": _num(sum(f_per_layer) / n_layers),
        "f_attn_per_layer": _nums(f_per_layer),
        "f_attn_per_head": [_nums(a.first_token_attention_per_head().tolist()) for a in probe.attention],
        "eps": eps,
        "sink_eps": _num(sink_fraction(alphas, eps)),
        "sink_eps_per_layer": _nums(sink_fraction_per_layer(alphas, eps)),
        "sink_alpha": [_nums(a.tolist()) for a in alphas],
        "sink_mass": _num(sum(with_sink) / len(with_sink)) if has_sink else None,
        "sink_mass_per_layer": _nums(sink_masses) if has_sink else None,
    }


def _activation_results(probe: Probe) -> dict[str, Any]:
    acts = probe.activations
    ratios = [a.ratio for a in acts]
    top = max(range(probe.n_layers), key=lambda i: acts[i].max_abs)
    return {
        "m_act": _num(acts[top].max_abs),
        "m_act_layer": top,
        "m_act_per_layer": _nums(a.max_abs for a in acts),
        "m_act_ratio": _num(ratios[top]),
        "m_act_ratio_max": _num(max(ratios)),
        "m_act_ratio_per_layer": _nums(ratios),
        "m_act_median_per_layer": _nums(a.median_abs for a in acts),
        "m_act_location_per_layer": [list(a.where) if a.where is not None else None for a in acts],
    }


def _gate_results(probe: Probe) -> dict[str, Any]:
    total = probe.model_gate_stats()
    if total is None:
        keys = ("gate_mean", "gate_frac_below_0.01", "gate_frac_below_0.001", "gate_count", "gate_per_layer",
                "gate_mean_per_layer", "gate_per_score", "gate_histogram")
        return dict.fromkeys(keys)
    summary = _gate_summary(total)
    per_layer = [_gate_summary(probe.layer_gate_stats(i)) for i in range(probe.n_layers)]
    return {
        "gate_mean": summary["mean"],
        "gate_frac_below_0.01": summary["frac_below_0.01"],
        "gate_frac_below_0.001": summary["frac_below_0.001"],
        "gate_count": summary["count"],
        "gate_per_layer": per_layer,
        "gate_mean_per_layer": [s["mean"] if s is not None else None for s in per_layer],
        "gate_per_score": {name: _gate_summary(s) for name, s in probe.gate_stats_by_name().items()},
        "gate_histogram": _histogram(total),
    }


# --------------------------------------------------------------------------- extrapolate


def rope_for_method(base: RopeConfig, method: str, factor: float, train_len: int) -> RopeConfig:
    """``base`` with the RoPE scaling of ``method``: ``plain`` is no scaling; ``linear``,
    ``ntk`` and ``yarn`` scale by ``factor`` (>= 1) relative to ``train_len``. Theta, the
    rotated fraction and YaRN's betas are kept."""
    if method not in EXTRAPOLATION_METHODS:
        raise GatedAttnError(f"unknown RoPE method {method!r}; choose from {', '.join(EXTRAPOLATION_METHODS)}")
    if method == "plain":
        return dataclasses.replace(base, scaling="none", factor=1.0)
    return dataclasses.replace(base, scaling=method, factor=max(float(factor), 1.0), original_max_len=int(train_len))


@contextlib.contextmanager
def scaled_rope(model: nn.Module, method: str, factor: float, train_len: int) -> Iterator[nn.Module]:
    """Within the body, every layer rotates with ``rope_for_method(layer rope, method,
    factor, train_len)`` (``Attention.with_rope``); the layers' own RoPE returns after."""
    with contextlib.ExitStack() as stack:
        for block in attention_layers(model):
            stack.enter_context(block.attn.with_rope(rope_for_method(block.attn.cfg.rope, method, factor, train_len)))
        yield model


def _windows(data: Any, seq_len: int, n_windows: int, rows: int) -> Iterator[Tensor]:
    """The first ``n_windows`` validation windows of ``seq_len``, ``rows`` per batch."""
    left = n_windows
    for batch in data.val_batches(seq_len=seq_len, batch_size=min(rows, n_windows)):
        batch = batch[:left]
        left -= batch.shape[0]
        yield batch
        if left <= 0:
            return


def _length_loss(model: nn.Module, batches: Iterable[Tensor], train_len: int, device: torch.device,
                 vocab_size: int | None) -> tuple[float, float | None, int]:
    """(mean loss, mean loss at input positions >= train_len (None if none), tokens)."""
    total, beyond, n, n_beyond = 0.0, 0.0, 0, 0
    for batch in batches:
        batch = _check_batch(batch, vocab_size).to(device)
        ce = _token_losses(model(batch[:, :-1]), batch[:, 1:])  # (B, L)
        total += float(ce.sum())
        n += ce.numel()
        tail = ce[:, train_len:]
        beyond += float(tail.sum())
        n_beyond += tail.numel()
    return total / n, (beyond / n_beyond if n_beyond else None), n


def _check_extrapolation_args(model: nn.Module, train_len: int | None, multiples: Sequence[float],
                              methods: Sequence[str], tokens: int | None, batch_size: int) -> int:
    """Every argument of :func:`extrapolate` checked; returns ``train_len`` resolved."""
    blocks = attention_layers(model)
    if train_len is None:
        train_len = getattr(getattr(model, "cfg", None), "max_seq_len", None)
        if train_len is None:
            raise GatedAttnError("extrapolate needs train_len (the model config has no max_seq_len)")
    if int(train_len) < 1:
        raise GatedAttnError(f"train_len must be >= 1, got {train_len!r}")
    train_len = int(train_len)
    if not multiples:
        raise GatedAttnError("extrapolate needs at least one multiple")
    if not methods:
        raise GatedAttnError("extrapolate needs at least one method")
    for m in multiples:
        if not m > 0:
            raise GatedAttnError(f"multiples must be > 0, got {m!r}")
    for method in methods:
        rope_for_method(blocks[0].attn.cfg.rope, method, 1.0, train_len)  # validates the name
    if batch_size < 1:
        raise GatedAttnError(f"batch_size must be >= 1, got {batch_size!r}")
    if tokens is not None and tokens < 1:
        raise GatedAttnError(f"tokens must be >= 1, got {tokens!r}")
    return train_len


def extrapolate(
    model: nn.Module,
    data: Any,
    *,
    train_len: int | None = None,
    multiples: Sequence[float] = (1, 2, 4, 8),
    methods: Sequence[str] = ("plain", "ntk", "yarn"),
    tokens: int | None = None,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Validation loss at ``multiples`` of the training context, per RoPE method.

    ``data`` is a ``TokenData`` (``val_batches`` and ``num_val_windows`` are used);
    ``train_len`` defaults to ``model.cfg.max_seq_len``. Length ``L = round(m * train_len)``
    is evaluated on the first ``tokens // L`` validation windows of ``L`` tokens, so every
    length sees the same ``tokens`` tokens of the val stream (exactly, when ``L`` divides
    ``tokens``). ``tokens`` defaults to ``batch_size`` windows of the longest length and is
    capped by the val split; each forward pass holds ``batch_size * longest / L`` windows,
    i.e. the same number of tokens at every length. A length with no window in the val
    split is skipped, with the reason.

    Methods: ``plain`` (no scaling), ``ntk``, ``yarn``, ``linear``; scaled methods use
    ``factor = max(multiple, 1)`` and ``original_max_len = train_len``.

    Returns ``{variant, train_len, multiples, lengths, n_tokens, skipped, methods,
    loss_beyond}``: ``methods[m]`` is the list of validation losses aligned with
    ``lengths`` (None for a skipped length), ``loss_beyond[m]`` the same for the loss at
    input positions ``>= train_len`` only (None at lengths <= train_len), ``n_tokens`` the
    tokens evaluated per length. :func:`extrapolation_curves` turns it into the input of
    ``plots.plot_extrapolation``.
    """
    cfg = getattr(model, "cfg", None)
    train_len = _check_extrapolation_args(model, train_len, multiples, methods, tokens, batch_size)
    vocab_size = getattr(cfg, "vocab_size", None)
    device = _model_device(model)

    lengths = [max(1, round(m * train_len)) for m in multiples]
    available = {L: data.num_val_windows(L) for L in lengths}
    runnable = [L for L in lengths if available[L] >= 1]
    skipped = [
        {"multiple": m, "length": L,
         "reason": f"the val split has {data.val_tokens} tokens, fewer than one window of {L}"}
        for m, L in zip(multiples, lengths, strict=True) if available[L] < 1
    ]
    plan: dict[int, tuple[int, int]] = {}  # length -> (windows, rows per batch)
    if runnable:
        longest = max(runnable)
        budget = min(tokens if tokens is not None else batch_size * longest, available[longest] * longest)
        for L in runnable:
            plan[L] = (max(1, budget // L), max(1, batch_size * longest // L))

    losses: dict[str, list[float | None]] = {}
    beyond_losses: dict[str, list[float | None]] = {}
    n_tokens: dict[int, int] = {}
    with _eval_mode(model):
        for method in methods:
            losses[method], beyond_losses[method] = [], []
            for m, L in zip(multiples, lengths, strict=True):
                if L not in plan:
                    losses[method].append(None)
                    beyond_losses[method].append(None)
                    continue
                windows, rows = plan[L]
                with scaled_rope(model, method, m, train_len):
                    loss, beyond, n = _length_loss(model, _windows(data, L, windows, rows), train_len, device,
                                                   vocab_size)
                n_tokens[L] = n
                losses[method].append(_num(loss))
                beyond_losses[method].append(_num(beyond))
    return {
        "variant": getattr(cfg, "variant", type(model).__name__),
        "train_len": train_len,
        "multiples": list(multiples),
        "lengths": lengths,
        "n_tokens": [n_tokens.get(L) for L in lengths],
        "skipped": skipped,
        "methods": losses,
        "loss_beyond": beyond_losses,
    }


def extrapolation_curves(result: dict[str, Any]) -> dict[str, dict[str, list]]:
    """``{method: {lengths, loss}}`` of an :func:`extrapolate` result, the per-variant
    input of ``plots.plot_extrapolation``."""
    return {m: {"lengths": list(result["lengths"]), "loss": list(losses)} for m, losses in result["methods"].items()}


# --------------------------------------------------------------------------- text output


def _fmt(x: float | None, spec: str) -> str:
    return fmt_value(x, spec, missing="-")


def _first_token_line(r: dict[str, Any]) -> str | None:
    ft, windows = r.get("first_token"), r.get("windows")
    if ft is None or windows is None:
        return None
    token = "no special token" if ft["mode"] == "none" else f"{ft['mode']} (id {_fmt(ft['id'], 'd')})"
    return f"first token: {token}; {windows['count']} windows of {_fmt(windows['length'], 'd')} tokens"


def _channel_line(r: dict[str, Any]) -> str | None:
    top = (r.get("m_act_channels") or {}).get("top")
    if not top:
        return None
    items = [f"channel {e['channel']} at position {e['position']} in layer {e['layer']} ({_fmt(e['value'], '.4g')})"
             for e in top]
    return "largest |h|: " + "; ".join(items)


def format_analysis(r: AnalysisResult) -> str:
    """A readable per-layer table of an :func:`analyze` result."""
    lines = [
        f"variant {r['variant']}: {r['n_layers']} layers, {r['n_heads']} heads; "
        f"{r['n_sequences']} sequences, {r['n_tokens']} tokens",
        f"val loss {_fmt(r['val_loss'], '.4f')}  ppl {_fmt(r['val_ppl'], '.2f')}",
    ]
    first = _first_token_line(r)
    lines += ([first] if first is not None else []) + [""]
    sink = r.get("sink_mass_per_layer")
    n = r["n_layers"]
    drain = r.get("value_drain_per_layer") or [None] * n
    peak = r.get("residual_peak_per_layer") or [None] * n
    sink_head = "sink a>" + format(r["eps"], "g")
    header = (f"{'layer':>5} {'F-Attn':>8} {sink_head:>10} {'M-Act':>10} {'ratio':>9} {'v0 drain':>9} "
              f"{'h0 peak':>9} {'gate mean':>10}")
    header += f" {'sink mass':>10}" if sink is not None else ""
    lines += [header, "-" * len(header)]
    gate_means = r.get("gate_mean_per_layer") or [None] * n
    for i in range(n):
        line = (f"{i:>5} {_fmt(r['f_attn_per_layer'][i], '.4f'):>8} {_fmt(r['sink_eps_per_layer'][i], '.3f'):>10} "
                f"{_fmt(r['m_act_per_layer'][i], '.2f'):>10} {_fmt(r['m_act_ratio_per_layer'][i], '.1f'):>9} "
                f"{_fmt(drain[i], '.3f'):>9} {_fmt(peak[i], '.2f'):>9} {_fmt(gate_means[i], '.4f'):>10}")
        if sink is not None:
            line += f" {_fmt(sink[i], '.4f'):>10}"
        lines.append(line)
    lines.append("-" * len(header))
    line = (f"{'all':>5} {_fmt(r['f_attn'], '.4f'):>8} {_fmt(r['sink_eps'], '.3f'):>10} "
            f"{_fmt(r['m_act'], '.2f'):>10} {_fmt(r['m_act_ratio'], '.1f'):>9} {'':>9} {'':>9} "
            f"{_fmt(r['gate_mean'], '.4f'):>10}")
    if sink is not None:
        line += f" {_fmt(r['sink_mass'], '.4f'):>10}"
    lines.append(line)
    if r["gate_mean"] is not None:
        lines.append(f"gate scores below 0.01: {_fmt(r['gate_frac_below_0.01'], '.4f')}, "
                     f"below 0.001: {_fmt(r['gate_frac_below_0.001'], '.4f')} ({r['gate_count']} scores)")
    else:
        lines.append("no gate")
    channels = _channel_line(r)
    if channels is not None:
        lines.append(channels)
    return "\n".join(lines)


def format_extrapolation(r: dict[str, Any]) -> str:
    """A readable table of an :func:`extrapolate` result: loss per method and length."""
    methods = list(r["methods"])
    lines = [f"variant {r['variant']}: validation loss vs length (training length {r['train_len']})", ""]
    header = f"{'length':>8} {'x':>5} {'tokens':>8} " + " ".join(f"{m:>10}" for m in methods)
    lines += [header, "-" * len(header)]
    for j, (m, L) in enumerate(zip(r["multiples"], r["lengths"], strict=True)):
        losses = " ".join(f"{_fmt(r['methods'][k][j], '.4f'):>10}" for k in methods)
        lines.append(f"{L:>8} {m:>5g} {_fmt(r['n_tokens'][j], 'd'):>8} {losses}")
    for s in r["skipped"]:
        lines.append(f"skipped length {s['length']}: {s['reason']}")
    return "\n".join(lines)
