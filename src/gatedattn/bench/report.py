"""The results of ``run_bench`` as Markdown: header, targets, one section per shape, KV cache."""

from __future__ import annotations

from gatedattn.bench.config import REFERENCE

MIB = 1024 * 1024


def _num(x, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _ms(x) -> str:
    return _num(None if x is None else 1e3 * x, ".2f")


def _mib(x) -> str:
    return _num(None if x is None else x / MIB, ".1f")


def _pct(x) -> str:
    return _num(None if x is None else 100 * x, ".1f") + ("" if x is None else " %")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def _verdict(target: dict) -> str:
    v = target.get("verdict")
    if v is None:  # results written before verdicts knew their noise
        met = target["met"]
        v = "not measured" if met is None else ("met" if met else "missed")
    return {"missed": "**MISSED**", "within noise": "*within noise*"}.get(v, v)


def _flops(x) -> str:
    return _num(None if x is None else x / 1e9, ",.1f")


def _peak_line(peak: dict, dtype: str) -> str:
    what = ("- model FLOP/s: forward + backward model FLOPs (3 x `gatedattn.cost` of the layer, of every block "
            "and the LM head for the training step) per second; MFU = model FLOP/s / peak")
    if "flops_per_s" not in peak:
        return f"{what}; no peak: {peak.get('error', 'not measured')}"
    return (f"{what}, the peak being {_flops(peak['flops_per_s'])} GFLOP/s of square {dtype} products on this "
            f"machine ({peak['source']})")


def _timing_rule(h: dict) -> str:
    rounds = f"median of {h['repeats']} repeats"
    if h.get("time_cap_s"):
        rounds = (f"median of at least {h['repeats']} repeats, repeated until every workload's spread is below "
                  f"{100 * h['max_spread']:g} % or {h['time_cap_s']:g} s of timed rounds per group")
    return (f"- timings: {rounds}, interleaved across workloads (A, B, C, C, B, A, ...; garbage collection paused "
            f"while timing) after {h['warmup']} warm-up rounds; spread = interquartile range / median")


def format_markdown(res: dict) -> str:
    h, m = res["header"], res["header"]["machine"]
    lines = ["# gatedattn bench", ""]
    if h.get("command"):
        lines += [f"Command: `{h['command']}`", ""]
    where = m.get("gpu") or f"{m['cpu']} ({m['cpu_capability']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads)"
    code = h.get("code") or {}
    lines += [
        f"- machine: {where}; load average (1 min) {_num(m.get('load_average_1m'), '.2f')} at the start, "
        f"{_num(m.get('load_average_1m_end'), '.2f')} at the end",
        f"- torch {m['torch']}, transformers {m.get('transformers')}, python {m['python']}; "
        f"gatedattn {code.get('gatedattn_version')} at {code.get('git_commit')}{' (dirty)' if code.get('git_dirty') else ''}",
        f"- device {h['device']}, precision {h['precision']['dtype']} ({h['precision']['reason']}), "
        f"torch.compile {'on' if h['compile'] else 'off'}",
        _timing_rule(h),
        f"- memory: {h['memory_meter']}",
        _peak_line(h.get("peak") or {}, h["precision"]["dtype"]),
        f"- ratios are against `{REFERENCE}` measured in the same run",
        "",
        "## Targets",
        "",
        "Spread of a ratio: the spreads of its two timings combined (memory and FLOP ratios are exact). A "
        "threshold inside measured × (1 ± spread) reads *within noise*: this run cannot tell.",
        "",
    ]
    lines += _table(["target", "shape", "measured", "spread", "ratio", "threshold", "verdict"], [
        [t["description"], t["shape"], _num(t["measured"]), _pct(t.get("spread")), t["ratio"],
         f"{t['op']} {t['threshold']:g}", _verdict(t)] for t in res["targets"]])
    for name, s in res["shapes"].items():
        sh = s["shape"]
        lines += ["", f"## Shape `{name}`: T={sh['seq_len']}, batch {sh['batch']}, d_model {sh['d_model']}, "
                      f"{sh['n_heads']} heads ({sh['n_kv_heads']} KV)", "",
                  f"Model for the training step and decoding: {sh['n_layers']} layers, FFN {sh['ffn_dim']}, "
                  f"vocabulary {sh['vocab_size']}; decoding {sh['decode_new']} tokens after a "
                  f"{sh['decode_prompt']}-token prompt. FLOPs / baseline: one attention layer's forward "
                  f"FLOPs (`gatedattn.cost`).", "",
                  "### Attention layer, forward + backward", ""]
        lines += _table(["workload", "median ms", "spread", "time / baseline", "FLOPs / baseline", "GFLOP/s", "MFU",
                         "memory MiB", "memory / baseline"], [
            [n, _ms(r["median_s"]), _pct(r["iqr_over_median"]), _num(r.get("time_ratio")), _num(r.get("flop_ratio")),
             _flops(r.get("model_flops_per_s")), _pct(r.get("mfu")), _mib(r["memory_bytes"]),
             _num(r.get("memory_ratio"))] for n, r in s["layer"].items()])
        lines += ["", "### Training step (`Trainer.train_step`: forward, fp32 loss, backward, clip, AdamW)", ""]
        lines += _table(["workload", "median ms", "spread", "tokens/s", "tokens/s / baseline", "GFLOP/s", "MFU",
                         "memory MiB", "memory / baseline", "FLOPs / baseline"], [
            [n, _ms(r["median_s"]), _pct(r["iqr_over_median"]), _num(r["tokens_per_s"], ",.0f"),
             _num(r.get("tokens_per_s_ratio")), _flops(r.get("model_flops_per_s")), _pct(r.get("mfu")),
             _mib(r["memory_bytes"]), _num(r.get("memory_ratio")), _num(r.get("flop_ratio"))]
            for n, r in s["train"].items()])
        lines += ["", "### Cached greedy decoding", "",
                  "Decode tokens/s = batch x (new tokens - 1) / (time to generate all - time to generate one): "
                  "the prefill cancels out.", ""]
        lines += _table(["workload", "generate ms", "spread", "prefill ms", "decode tokens/s",
                         "tokens/s / baseline", "FLOPs / baseline"], [
            [n, _ms(r["median_s"]), _pct(r["iqr_over_median"]), _ms(r["prefill"]["median_s"]),
             _num(r["tokens_per_s"], ",.0f"), _num(r.get("tokens_per_s_ratio")), _num(r.get("flop_ratio"))]
            for n, r in s["decode"].items()])
        if s["vs_hf"]:
            lines += ["", "### Against transformers", "",
                      "Speedup = our tokens/s / transformers' tokens/s (above 1: ours is faster). The layers are "
                      "ours converted from the transformers layer: same weights, same computation.", ""]
            lines += _table(["comparison", "ours", "transformers", "speedup", "memory ours / theirs"], [
                [c["comparison"], f"`{c['ours']}`", f"`{c['theirs']}`", _num(c["speedup"]),
                 _num(c["memory_ratio"])] for c in s["vs_hf"]])
    kv = res["kv_cache"]
    lines += ["", "## KV cache bytes per token: MLA vs GQA", "",
              "Measured by decoding a few tokens and summing the storages of every tensor the cache objects hold.", ""]
    lines += _table(["cache", "attention", "bytes / token (all layers)", "bytes / token / layer"], [
        [name, ", ".join(f"{k}={v}" for k, v in kv[name]["attention"].items()), _num(kv[name]["bytes_per_token"], ",.0f"),
         _num(kv[name]["bytes_per_token_per_layer"], ",.0f")] for name in ("gqa", "mla")])
    lines += ["", f"MLA / GQA: {_num(kv['mla_over_gqa'])}", ""]
    return "\n".join(lines)
