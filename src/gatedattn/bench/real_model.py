"""``gatedattn bench --real-model [PATH]``: our ``GatedLM`` against transformers'
``LlamaForCausalLM`` on the same pretrained weights (default: the bundled SmolLM2 GGUF).

Workloads, timed in interleaved rounds (``gatedattn.infra.timing``), ours and transformers' alike:

- ``forward``: the analysis forward, the next-token loss of ``batch`` x ``seq_len`` tokens,
  no gradients, eval mode; ours as ``analyze`` runs it: through ``models.casts.FrozenCasts``
  (under autocast the weights are cast once for every batch, not once per call), the LM head
  and the loss fused (``forward(ids, targets=...)``); transformers' with ``labels=`` (its
  logits, then its loss);
- ``logits``: for reference, the same forward returning the (B, T, V) logits, each model's
  plain call; no goal is set on it;
- ``train``: a full training step, forward, backward and AdamW on every parameter (fused,
  as both trainers run it on a CPU), each
  model's loss as its own trainer computes it (ours: ``forward(ids, targets=...)``, the LM
  head and the cross-entropy fused; transformers': ``labels=``, logits then the loss);
- ``frozen``: ours only, the step of the real-model study (``reproduce/pretrained``): every
  weight frozen, a learnable sink per head trained (Adam) in the layers from the study's
  start layer up (``frozen_start``, default :data:`STUDY_START_LAYER`), the layers below run
  once without gradients before the timed steps (``masked.prefix``: the residual stream
  entering the start layer is the same every step), each step the upper layers' forward
  and backward (the LM head and the loss fused, as the study's ``masked.tail_losses``) and
  the sinks' update (its ratio to our full step). Attention runs on the
  layers' own kernel (the study's ``window=0`` attention is the same causal attention in
  its reference form);
- ``decode``: greedy generation of ``decode_new`` tokens after a ``seq_len`` prompt;
- ``train-compiled``: the ``train`` step with each model ``torch.compile``d (``backend``,
  inductor by default), ours as ``gatedattn train`` compiles it where ``compile auto`` finds
  it pays (``nn.Module.compile``: the norms, residuals, RoPE, SwiGLU, gates and casts fused
  between the products), transformers' as its Trainer's ``torch_compile=True`` does; each
  compile is paid before the clock starts and reported (its first call beyond its median
  one), with the steps from which it pays for itself against the same model's eager step.
  Its products are the eager step's (the same products, dispatched from the graph);
- the load of the file itself, ours and transformers', each in a fresh child process
  (:mod:`gatedattn.bench.load`): seconds and peak resident memory.

Each row shows the median seconds, ours / transformers' speedup, model FLOP/s
(:mod:`gatedattn.models.mfu`) and MFU against this machine's measured peak of the dtype,
and the seconds each implementation's own matrix products take replayed alone
(:mod:`gatedattn.bench.products`): the floor under the row, at its real shapes. The row's
goal (:func:`goal`) is a speedup of :data:`SPEEDUP_GOAL`, the median of the rounds' own ratios
(ours and transformers' ran side by side in each round, so the machine's drift between
rounds cancels); where transformers already runs
within that factor of our products alone, no speedup of that size is left to take, and
the goal becomes running within :data:`FLOOR_GOAL` of that floor.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn.bench.load import format_load, hf_model, load_row
from gatedattn.bench.products import products_alone
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.heap import HEAPS, can_keep_freed_memory, keep_freed_memory
from gatedattn.models.casts import FrozenCasts
from gatedattn.models.mfu import forward_flops, mfu, peak_flops
from gatedattn.train.optim import fusable
from gatedattn.infra.precision import resolve_dtype
from gatedattn.infra.timing import interleaved_times
from gatedattn.hf import bundled_model_path, load_model


# the first layer the real-model study trains on the bundled SmolLM2-135M: the first whose
# F-Attn exceeds sink_layers_eps (docs/reproduction/results.json, pretrained.start_layer)
STUDY_START_LAYER = 3
SPEEDUP_GOAL = 1.15  # ours / transformers' on each row, at the same precision
FLOOR_GOAL = 1.10  # ours' seconds over its products' alone, where SPEEDUP_GOAL is out of reach
MFU_GOAL = 0.35  # of the measured bf16 peak, on a bf16 training step (eager or compiled)
KINDS = ("forward", "logits", "train", "train-compiled", "frozen", "decode")
GOAL_ROWS = ("forward", "train", "train-compiled", "decode")  # the rows a goal is set on ("logits": for reference)


def goal(speedup: float, bound: float, over_floor: float) -> str:
    """The row's verdict: ``met`` (``speedup`` >= :data:`SPEEDUP_GOAL`); else, where
    ``bound`` (transformers' seconds over our products' alone) is under that goal, so that
    not even free everything-else would reach it, ``at the floor`` when ours runs within
    :data:`FLOOR_GOAL` of its products (``over_floor``) and ``near the floor`` otherwise;
    else ``missed``."""
    if speedup >= SPEEDUP_GOAL:
        return "met"
    if bound < SPEEDUP_GOAL:
        return "at the floor" if over_floor <= FLOOR_GOAL else "near the floor"
    return "missed"


def _train_step(model: torch.nn.Module, ids: torch.Tensor, loss_of: Callable, precision) -> Callable[[], None]:
    params = [p for p in model.parameters() if p.requires_grad]
    # the fused AdamW, as each trainer runs it (ours: train.optim.fusable; transformers' Trainer: adamw_torch_fused)
    opt = torch.optim.AdamW(params, lr=1e-6, fused=fusable(params))

    def step() -> None:
        model.train()
        with precision.autocast("cpu"):
            loss = loss_of(model, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def sink_arm(ours, start: int):
    """The real-model study's sink arm of ``ours`` (a copy; ``arms.build_arm``, logits
    started at 0): the model and its trainable sinks, those of the layers from ``start`` up."""
    from gatedattn.reproduce.pretrained.arms import ARM_SPECS, build_arm  # lazy: heavy (matplotlib)

    model, groups = build_arm(ours, ARM_SPECS["sink-zero"], start)
    return model, [p for g in groups for p in g["params"]]


def _frozen_step(model, params, ids: torch.Tensor, start: int, precision) -> Callable[[], None]:
    """The real-model study's step (``arms.train_arm``) for an arm: the blocks below
    ``start`` once, without gradients; each step the blocks from ``start`` up, the head,
    the loss and Adam on ``params``. Under autocast the frozen weights are cast once
    (``FrozenCasts``, as ``train_arm`` runs it), not at every step."""
    opt = torch.optim.Adam(params, lr=1e-6)
    frozen = FrozenCasts(model)
    with torch.no_grad(), precision.autocast("cpu"):
        hidden = model.embed(ids[:, :-1])
        for block in model.blocks[:start]:
            hidden = block(hidden)
    targets = ids[:, 1:]

    def step() -> None:
        with precision.autocast("cpu"), frozen.applied():
            x = hidden
            for block in model.blocks[start:]:
                x = block(x)
            loss = model.head_loss(model.norm(x), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def frozen_start_layer(n_layers: int, start: int | None) -> int:
    """``start``, checked against the depth; None: :data:`STUDY_START_LAYER` (the last layer
    of a shallower model)."""
    if start is None:
        return min(STUDY_START_LAYER, n_layers - 1)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < n_layers:
        raise ConfigError(f"frozen_start={start!r} must be a layer index in [0, {n_layers})")
    return start


def _theirs(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def _our_loss(model, ids):
    """Our training loss as the trainer computes it: ``forward`` with targets (the LM head and
    the cross-entropy fused)."""
    return model(ids[:, :-1], targets=ids[:, 1:])


def _their_loss(model, ids):
    """transformers' training loss as its Trainer computes it: ``labels`` (here already
    shifted, ``shift_labels``, so both score the same positions)."""
    targets = ids[:, 1:].contiguous()
    return model(input_ids=ids[:, :-1], labels=targets, shift_labels=targets, use_cache=False).loss


def workloads(ours, theirs, ids: torch.Tensor, decode_new: int, precision,
              frozen_start: int | None = None, backend: str = "inductor") -> dict[str, Callable[[], Any]]:
    """name -> call: ``{ours,hf}:{forward,logits,train,train-compiled,decode}`` and
    ``ours:frozen``. The compiled steps train the same parameters as the eager ones (each
    with an optimizer of its own), through ``torch.compile(model, backend=backend)``."""
    start = frozen_start_layer(ours.cfg.n_layers, frozen_start)
    prompt = ids[:, :-1]

    def forward(model, output_of):
        def run():
            model.eval()  # as the analysis runs it
            with torch.no_grad(), precision.autocast("cpu"):
                output_of(model, ids)
        return run

    analysed = FrozenCasts(ours)  # as analyze runs ours: the weights cast once for every batch

    def decode_ours():
        ours.eval()
        with torch.no_grad(), precision.autocast("cpu"):
            ours.generate(prompt, decode_new, temperature=0)

    def decode_theirs():
        theirs.eval()
        with torch.no_grad(), precision.autocast("cpu"):
            theirs.generate(prompt, max_new_tokens=decode_new, min_new_tokens=decode_new, do_sample=False)

    return {"ours:forward": forward(ours, lambda model, ids: _our_loss(analysed, ids)),
            "hf:forward": forward(theirs, _their_loss),
            "ours:logits": forward(ours, lambda model, ids: analysed(ids[:, :-1])),
            "hf:logits": forward(theirs, lambda model, ids: _theirs(model, ids[:, :-1])),
            "ours:train": _train_step(ours, ids, _our_loss, precision),
            "hf:train": _train_step(theirs, ids, _their_loss, precision),
            "ours:train-compiled": _train_step(torch.compile(ours, backend=backend), ids, _our_loss, precision),
            "hf:train-compiled": _train_step(torch.compile(theirs, backend=backend), ids, _their_loss, precision),
            "ours:frozen": _frozen_step(*sink_arm(ours, start), ids, start, precision),
            "ours:decode": decode_ours, "hf:decode": decode_theirs}


def run_real_model_bench(path: str | Path | None = None, *, dtype: str = "auto", batch: int = 4, seq_len: int = 256,
                         decode_new: int = 16, repeats: int = 5, warmup: int = 2,
                         frozen_start: int | None = None, load_repeats: int = 2,
                         backend: str = "inductor", heap: str = "default") -> dict[str, Any]:
    """Time every workload; a JSON-ready dict with one row per workload kind. Two warm-up
    rounds: a training step's second call is its slowest (on SmolLM2 in bf16, 3.5 s against
    2.1 s from the third on; the heap grows once more when the activations first meet the
    optimizer's state), and the rows are the steady state. ``backend`` compiles the
    ``train-compiled`` rows (another than inductor only to check the bench itself quickly).
    ``heap="kept"`` runs both models with glibc's freed blocks kept for the next step
    (:func:`gatedattn.infra.heap.keep_freed_memory`, for the rest of this process), not
    returned to the kernel and faulted in again at every step as by default."""
    check_heap(heap)
    path = Path(path) if path is not None else bundled_model_path()
    if heap == "kept" and not keep_freed_memory():
        raise GatedAttnError("heap='kept': glibc's mallopt refused the thresholds; nothing was timed")
    precision = resolve_dtype(dtype, "cpu")
    ours = load_model(path)
    theirs = hf_model(path)
    cfg = ours.cfg
    start = frozen_start_layer(cfg.n_layers, frozen_start)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    calls = workloads(ours, theirs, ids, decode_new, precision, start, backend)
    first = {}
    for name in ("ours:train-compiled", "hf:train-compiled"):  # each compile paid before the clock starts
        started = time.perf_counter()
        calls[name]()
        first[name] = time.perf_counter() - started
    times = interleaved_times(calls, repeats=repeats, warmup=warmup)
    median = {k: statistics.median(v) for k, v in times.items()}
    peak = peak_flops(precision.dtype)
    fwd = forward_flops(cfg, seq_len) * batch
    flops = {"forward": fwd, "logits": fwd, "train": 3 * fwd, "train-compiled": 3 * fwd}
    # a compiled step runs the eager step's products, dispatched from its graph
    alone = {name: products_alone(fn, repeats=repeats) for name, fn in calls.items() if "compiled" not in name}
    alone.update({f"{who}:train-compiled": alone[f"{who}:train"] for who in ("ours", "hf")})
    rows = [_row(kind, times, median, alone, flops.get(kind), peak.flops_per_s) for kind in KINDS]
    rows[KINDS.index("train-compiled")].update(_compile_figures(first, median))
    load = load_row(path, repeats=load_repeats, threads=torch.get_num_threads())
    return {"model": str(path), "precision": precision.as_dict(), "batch": batch, "seq_len": seq_len,
            "decode_new": decode_new, "repeats": repeats, "warmup": warmup, "peak": peak.to_dict(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "rows": rows, "load": load, "load_repeats": load_repeats,
            "frozen_over_full": median["ours:frozen"] / median["ours:train"], "frozen_start": start,
            "backend": backend, "heap": heap, "mfu_goal": mfu_goal(rows, precision.dtype),
            "goals": {"speedup": SPEEDUP_GOAL, "floor": FLOOR_GOAL, "mfu": MFU_GOAL}}


def check_heap(heap: str) -> None:
    """``heap`` is one of :data:`gatedattn.infra.heap.HEAPS`, and ``kept`` only where the
    allocator is glibc's."""
    if heap not in HEAPS:
        raise ConfigError(f"heap={heap!r} must be one of {', '.join(HEAPS)}")
    if heap == "kept" and not can_keep_freed_memory():
        raise ConfigError("heap='kept' needs glibc's malloc (mallopt and mallinfo2, glibc 2.33 or later); this "
                          "process's C library is another")


def _row(kind: str, times: dict, median: dict, alone: dict, flops: float | None, peak: float) -> dict[str, Any]:
    """One workload's row: medians, speedups (of the medians, and per round), products alone,
    the goal where one is set, model FLOP/s and MFU where the FLOPs are counted."""
    o, h = median[f"ours:{kind}"], median.get(f"hf:{kind}")
    row = {"kind": kind, "ours_s": o, "hf_s": h, "speedup": h / o if h else None,
           "speedup_rounds": _round_ratios(times.get(f"hf:{kind}"), times[f"ours:{kind}"]),
           "ours_samples": times[f"ours:{kind}"], "hf_samples": times.get(f"hf:{kind}"),
           "ours_products": alone[f"ours:{kind}"], "hf_products": alone.get(f"hf:{kind}")}
    floor = alone[f"ours:{kind}"]["seconds"]
    row["ours_over_floor"] = o / floor
    if h:
        row["speedup_paired"] = statistics.median(row["speedup_rounds"])
        row["bound"] = h / floor
        if kind in GOAL_ROWS:
            row["goal"] = goal(row["speedup_paired"], row["bound"], row["ours_over_floor"])
    if flops is not None:
        row.update(ours_flops_per_s=flops / o, ours_mfu=mfu(flops / o, peak),
                   hf_flops_per_s=flops / h, hf_mfu=mfu(flops / h, peak))
    return row


def _compile_figures(first: dict[str, float], median: dict[str, float]) -> dict[str, Any]:
    """Each model's compile (its compiled step's first call beyond its median one) and the
    training steps from which the compile pays for itself against its own eager step (None
    where the compiled step is no faster)."""
    out = {}
    for who in ("ours", "hf"):
        compiled, eager = median[f"{who}:train-compiled"], median[f"{who}:train"]
        compile_s = max(0.0, first[f"{who}:train-compiled"] - compiled)
        out[f"{who}_compile_s"] = compile_s
        out[f"{who}_over_eager"] = eager / compiled
        out[f"{who}_break_even_steps"] = compile_s / (eager - compiled) if eager > compiled else None
    return out


def mfu_goal(rows: list[dict[str, Any]], dtype: str) -> dict[str, Any] | None:
    """The bf16 training steps' MFU against :data:`MFU_GOAL` (None in another dtype): each
    training row's ours MFU and ``met`` where it reaches the goal."""
    if dtype != "bf16":
        return None
    return {r["kind"]: {"mfu": r["ours_mfu"], "goal": "met" if r["ours_mfu"] >= MFU_GOAL else "missed"}
            for r in rows if r["kind"] in ("train", "train-compiled")}


def _round_ratios(theirs: list[float] | None, ours: list[float]) -> list[float] | None:
    """transformers' seconds over ours in each round (the two ran side by side in it), so a
    reader sees how far a speedup moves from round to round."""
    return None if theirs is None else [h / o for h, o in zip(theirs, ours)]


def format_real_model(res: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f} %"

    lines = [f"# Real-model bench: {Path(res['model']).name}", "",
             f"{res['batch']} x {res['seq_len']} tokens, decode {res['decode_new']} new tokens; "
             f"{res['precision']['dtype']} ({res['precision']['reason']}); CPU capability {res['cpu_capability']}, "
             f"{res['threads']} threads; peak {res['peak']['flops_per_s'] / 1e9:.0f} GFLOP/s "
             f"({res['peak']['source']}); medians of {res['repeats']} interleaved rounds after "
             f"{res.get('warmup', 1)} warm-up rounds{_heap_words(res)}.", "",
             "| workload | ours (s) | transformers (s) | speedup | per round | ours MFU | transformers MFU "
             "| products alone: ours / transformers (s) | ours / its products | bound | goal |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        hf = "–" if r["hf_s"] is None else f"{r['hf_s']:.3f}"
        speed = "–" if r["speedup"] is None else f"{r['speedup']:.3f}"
        if r.get("speedup_rounds"):
            rounds = r["speedup_rounds"]
            speed += f" | {r['speedup_paired']:.3f} ({min(rounds):.2f}–{max(rounds):.2f})"
        else:
            speed += " | –"
        alone = f"{r['ours_products']['seconds']:.3f}"
        if r.get("hf_products"):
            alone += f" / {r['hf_products']['seconds']:.3f}"
        bound = f"{r['bound']:.2f}" if "bound" in r else "–"
        lines.append(f"| {r['kind']} | {r['ours_s']:.3f} | {hf} | {speed} | {pct(r.get('ours_mfu'))} | "
                     f"{pct(r.get('hf_mfu'))} | {alone} | {r['ours_over_floor']:.2f} | {bound} | {r.get('goal', '–')} |")
    goals = res.get("goals", {"speedup": SPEEDUP_GOAL, "floor": FLOOR_GOAL})
    if "load" in res:  # (a result written before the load row was measured has none)
        lines += ["", format_load(res["load"], res["load_repeats"])]
    lines += ["", f"Frozen-model step (learnable sinks in layers {res['frozen_start']}+, the layers below run once "
                  f"without gradients) / full step: {res['frozen_over_full']:.3f}."]
    lines += _compiled_lines(res)
    lines += ["",
              f"Products alone: the row's matrix products replayed on their own operands (the floor at the "
              f"row's shapes); speedup: the ratio of the medians; per round: the median of the rounds' own "
              f"ratios (the two ran side by side in each, so drifts of the machine between rounds cancel), "
              f"in brackets the lowest and highest; bound: transformers' seconds over ours' products alone, the largest speedup "
              f"left if everything else were free. Goal: met at a per-round speedup >= {goals['speedup']}; where the "
              f"bound is under that, at the floor within {goals['floor']}x of ours' products, else near it. The "
              f"forward row is the analysis forward (the loss of the tokens, as analyze runs it); the logits row, "
              f"the same forward returning the logits, is there for reference and has no goal. The train-compiled "
              f"row's products are the train row's (the same products, dispatched from the graph).", ""]
    return "\n".join(lines)


def _heap_words(res: dict[str, Any]) -> str:
    """How freed memory was handled, where not glibc's default (a result written before the
    option existed ran with the default)."""
    if res.get("heap", "default") == "default":
        return ""
    return "; glibc's freed blocks kept in the heap for the next step (`--heap kept`), not returned to the kernel"


def _compiled_lines(res: dict[str, Any]) -> list[str]:
    """The compiled training row's compiles and break-even, and the bf16 MFU goal (a result
    written before the compiled row was measured has neither)."""
    row = next((r for r in res["rows"] if r["kind"] == "train-compiled"), None)
    if row is None:
        return []

    def one(who: str, name: str) -> str:
        even = row[f"{who}_break_even_steps"]
        pays = f"pays for itself after {even:,.0f} steps" if even is not None else "never pays (no faster than eager)"
        return (f"{name} compiled in {row[f'{who}_compile_s']:.1f} s, its step {row[f'{who}_over_eager']:.2f}x its "
                f"eager one, {pays}")

    lines = ["", f"Compiled training ({res['backend']}): {one('ours', 'ours')}; {one('hf', 'transformers')}."]
    if res.get("mfu_goal"):
        got = ", ".join(f"{kind} {100 * g['mfu']:.1f} % ({g['goal']})" for kind, g in res["mfu_goal"].items())
        lines += ["", f"bf16 training MFU against the goal of {100 * res['goals']['mfu']:.0f} % of the measured peak: "
                      f"{got}."]
    return lines
