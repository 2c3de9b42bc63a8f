"""``gatedattn bench --decode [PATH]``: greedy decoding of a pretrained model (default: the
bundled SmolLM2 GGUF), ours eager and compiled against transformers' eager ``generate`` and
its static cache + ``torch.compile`` path, on the same weights.

Rows, timed in interleaved rounds (``gatedattn.infra.timing``) after every path has run
once (so every compile is paid before the clock starts):

- ``ours eager``: ``GatedLM.generate(compile=False)``, a growing KV cache;
- ``ours compiled``: ``generate(compile=True)``: one compiled step over a static cache
  (``models.decode``);
- ``ours HF wrapper, static + compile``: the same model behind ``GatedAttnForCausalLM``
  (what ``AutoModelForCausalLM`` loads), through transformers' ``generate`` and its
  compiled static-cache path below (``hf.static``);
- ``transformers eager``: ``generate()`` with its dynamic cache;
- ``transformers static + compile``: ``generate(cache_implementation="static",
  compile_config=CompileConfig(fullgraph=True, mode="default"))``, its compiled decoding
  (asked for on a CPU, where transformers does not compile by itself).

Each row's speedup over transformers' eager ``generate`` is given as the ratio of the
medians and per round (the median of each round's own ratio: the two ran side by side in
it, so the machine's drift between rounds cancels). Each compiled path's compile is the seconds of its first call beyond its median call. The
break-even is the new tokens from which ours compiled, compile included, takes less time
than ours eager: the compile over the seconds a token saves. ``generate(compile="auto")``
compiles from ``models.decode.AUTO_MIN_TOKENS`` new tokens, set from this figure. Whether
the compiled tokens equal the eager ones is recorded (in fp32 they must; in bf16 a fused
kernel rounds differently, and a greedy decode may take another token where two logits
lie within that rounding).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn.bench.load import hf_model
from gatedattn.infra.precision import resolve_dtype
from gatedattn.infra.timing import interleaved_times
from gatedattn.hf import bundled_model_path, load_model
from gatedattn.hf.importers import quiet_transformers

PATHS = ("ours eager", "ours compiled", "ours HF wrapper, static + compile", "transformers eager",
         "transformers static + compile")


def _calls(ours, theirs, ids: torch.Tensor, new: int, precision,
           backend: str) -> dict[str, Callable[[], torch.Tensor]]:
    from transformers import CompileConfig  # lazy: heavy (transformers)

    from gatedattn.hf.auto import GatedAttnForCausalLM  # lazy: heavy (transformers)
    from gatedattn.hf.configuration import GatedAttnHFConfig  # lazy: heavy (transformers)

    compile_config = CompileConfig(fullgraph=True, mode="default", backend=backend)
    compile_config._compile_all_devices = True  # transformers compiles only on accelerators unless asked

    def ours_with(compile: bool | str):
        def run():
            with torch.no_grad(), precision.autocast("cpu"):
                return ours.generate(ids, new, temperature=0, compile=compile)
        return run

    def generate_with(model, **kwargs):
        def run():
            with torch.no_grad(), precision.autocast("cpu"), quiet_transformers():
                return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kwargs)
        return run

    wrapper = GatedAttnForCausalLM(GatedAttnHFConfig.from_model_config(ours.cfg), model=ours).eval()
    static = dict(cache_implementation="static", compile_config=compile_config)
    return dict(zip(PATHS, (ours_with(False), ours_with(backend), generate_with(wrapper, **static),
                            generate_with(theirs), generate_with(theirs, **static))))


def run_decode_bench(path: str | Path | None = None, *, dtype: str = "auto", batch: int = 1, prompt: int = 32,
                     new: int = 64, repeats: int = 5, warmup: int = 1, backend: str = "inductor") -> dict[str, Any]:
    """Time every path; a JSON-ready dict (rows, compile seconds, break-even, tokens).
    ``backend`` compiles both compiled paths (another than inductor only to check the
    bench itself quickly)."""
    path = Path(path) if path is not None else bundled_model_path()
    precision = resolve_dtype(dtype, "cpu")
    ours, theirs = load_model(path).eval(), hf_model(path)
    ids = torch.randint(0, ours.cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    calls = _calls(ours, theirs, ids, new, precision, backend)
    first, outputs = {}, {}
    for name, call in calls.items():
        started = time.perf_counter()
        outputs[name] = call()
        first[name] = time.perf_counter() - started
    times = interleaved_times(calls, repeats=repeats, warmup=warmup)
    median = {name: statistics.median(v) for name, v in times.items()}
    compile_s = {name: max(0.0, first[name] - median[name]) for name in PATHS if "compile" in name}
    saved = (median["ours eager"] - median["ours compiled"]) / new  # seconds per token
    rows = []
    for name in PATHS:
        rounds = [h / o for h, o in zip(times["transformers eager"], times[name])]  # side by side in a round
        rows.append({"path": name, "seconds": median[name], "per_token_s": median[name] / new,
                     "vs_transformers_eager": median["transformers eager"] / median[name],
                     "vs_transformers_eager_rounds": rounds, "vs_transformers_eager_paired": statistics.median(rounds),
                     "samples": times[name]})
    return {"model": str(path), "precision": precision.as_dict(), "batch": batch, "prompt": prompt, "new": new,
            "repeats": repeats, "warmup": warmup, "backend": backend, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "rows": rows,
            "compile_s": compile_s,
            "break_even_tokens": compile_s["ours compiled"] / saved if saved > 0 else None,
            "same_tokens": {name: bool(torch.equal(outputs[name], outputs["ours eager"])) for name in PATHS[1:]}}


def format_decode(res: dict[str, Any]) -> str:
    """The results as a Markdown table and two sentences."""
    lines = [f"# Decode bench: {Path(res['model']).name}", "",
             f"batch {res['batch']}, {res['prompt']}-token prompt, {res['new']} new tokens (greedy); "
             f"{res['precision']['dtype']} ({res['precision']['reason']}); CPU capability {res['cpu_capability']}, "
             f"{res['threads']} threads; medians of {res['repeats']} interleaved rounds after {res['warmup']} "
             f"warm-up round(s), every compile ({res['backend']}) paid before them.", "",
             "| path | seconds | ms per token | vs transformers eager | per round (median, range) |",
             "|---|---|---|---|---|"]
    for row in res["rows"]:
        rounds = row["vs_transformers_eager_rounds"]
        lines.append(f"| {row['path']} | {row['seconds']:.3f} | {1e3 * row['per_token_s']:.1f} | "
                     f"{row['vs_transformers_eager']:.2f}x | {row['vs_transformers_eager_paired']:.2f}x "
                     f"({min(rounds):.2f}–{max(rounds):.2f}) |")
    ours = {r["path"]: r for r in res["rows"]}
    even = res["break_even_tokens"]
    lines += ["", "Compile: " + ", ".join(f"{name} {s:.1f} s" for name, s in res["compile_s"].items()) + ". Ours compiled is "
              f"{ours['ours eager']['seconds'] / ours['ours compiled']['seconds']:.2f}x ours eager and "
              f"{ours['transformers static + compile']['seconds'] / ours['ours compiled']['seconds']:.2f}x "
              f"transformers' compiled path; "
              + (f"the compile pays for itself after {even:,.0f} new tokens." if even is not None else
                 "the compiled step saved no time per token here, so the compile never pays for itself."),
              "Tokens equal to ours eager: " + ", ".join(f"{name} {same}" for name, same in res["same_tokens"].items())
              + "."]
    return "\n".join(lines) + "\n"
