"""Named presets: every variant of both papers as one ``AttentionConfig``.

``VARIANTS[name](d_model=..., n_heads=..., n_kv_heads=..., head_dim=..., **fields)``
returns the config; extra ``fields`` (``kv="mla"``, ``qk_norm=True``, ``rope=...``)
pass through to ``AttentionConfig``. The registry also drives ``gatedattn variants``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

from gatedattn.layers.config import AttentionConfig, GateConfig
from gatedattn.infra.errors import ConfigError
from gatedattn.infra.sizes import MODEL_LIMITS, check_flag_range
from gatedattn.paper import HYGA_LOWRANK, HYGA_OVER_GATED, HYGA_SINK_GAIN, PPL


@dataclass(frozen=True)
class Preset:
    """A named variant: ``make(head_dim)`` gives the fields that differ from the baseline."""

    name: str
    description: str
    paper: str
    make: Callable[[int], dict[str, Any]]

    def __call__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        **fields: Any,
    ) -> AttentionConfig:
        base = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
        changes = self.make(base.head_dim)
        gate_fields = fields.pop("gate_fields", None)
        if gate_fields:
            if changes.get("gate") is None:
                raise ConfigError(f"variant {self.name!r} has no gate; gate_fields cannot apply")
            changes["gate"] = dataclasses.replace(changes["gate"], **gate_fields)
        return dataclasses.replace(base, **{**changes, **fields})


def _gate(**kw: Any) -> Callable[[int], dict[str, Any]]:
    return lambda head_dim: {"gate": GateConfig(**kw)}


def _hyga(low_rank: int | None = None, **kw: Any) -> Callable[[int], dict[str, Any]]:
    def make(head_dim: int) -> dict[str, Any]:
        d_int = low_rank or head_dim
        gate = GateConfig(h_dim=d_int, cross_head=True, rank=low_rank or 0, **kw)
        return {"gate": gate}

    return make


def _ppl(name: str) -> str:
    return f"PPL {PPL[name]:.3f}"


_PRESETS = [
    Preset("baseline", "softmax attention, no gate", _ppl("baseline"), lambda d: {}),
    Preset("gated", "G1 elementwise head-specific sigmoid gate (the paper's choice)", _ppl("gated"), _gate()),
    Preset("gated-headwise", "G1 with one score per head", _ppl("gated-headwise"), _gate(granularity="headwise")),
    Preset("g2-value", "gate after the value projection", _ppl("g2-value"), _gate(position="g2")),
    Preset("g3-key", "gate after the key projection", _ppl("g3-key"), _gate(position="g3")),
    Preset("g4-query", "gate after the query projection", _ppl("g4-query"), _gate(position="g4")),
    Preset("g5-dense", "gate after the output projection W_O", _ppl("g5-dense"), _gate(position="g5")),
    Preset("g1-shared", "G1, one gate shared by all heads", _ppl("g1-shared"), _gate(shared=True)),
    Preset("g1-silu", "G1 with SiLU instead of sigmoid", _ppl("g1-silu"), _gate(activation="silu")),
    Preset("g1-additive-silu", "G1 additive: Y + SiLU(XW)", _ppl("g1-additive-silu"), _gate(activation="silu", combine="add")),
    Preset("g1-ns-sigmoid", "G1 with 0.5 + 0.5 sigmoid (range [0.5, 1])", _ppl("g1-ns-sigmoid"), _gate(activation="ns-sigmoid")),
    Preset("g1-static", "G1 with learned constant (input-independent) scores", _ppl("g1-static"), _gate(source="static")),
    Preset("sdpa-rmsnorm", "per-head RMSNorm on the SDPA output, no gate", _ppl("sdpa-rmsnorm"), lambda d: {"head_transform": "rmsnorm"}),
    Preset("sdpa-silu", "parameter-free SiLU on the SDPA output, no gate", _ppl("sdpa-silu"), lambda d: {"head_transform": "silu"}),
    Preset("hyga", "HyGA: X+H gates fused additively, C-gate, d_int = head_dim", f"avg +{HYGA_OVER_GATED:g} over gated", _hyga()),
    Preset("hyga-lowrank", "HyGA with low-rank X-gate and H-gate, d_int = 16", f"d_int {HYGA_LOWRANK[0]}: {100 * HYGA_LOWRANK[1]:.0f}% of gate compute", _hyga(16)),
    Preset("hyga-mulfusion", "HyGA with separate sigmoids multiplied (rejected by the paper)", "worse than additive", _hyga(fusion="multiply")),
    Preset("hyga-sink", "HyGA plus a learnable per-head sink", "", lambda d: {**_hyga()(d), "sink": True}),
    Preset("hyga-h", "HyGA's H-gate alone: logits from each head's own output, d_int = head_dim", "HyGA ablation",
           lambda d: {"gate": GateConfig(source="none", h_dim=d)}),
    Preset("hyga-c", "HyGA's C-gate alone: a headwise sigmoid from all heads' outputs", "HyGA ablation",
           _gate(source="none", cross_head=True)),
    Preset("sink", "baseline plus a learnable per-head sink (GPT-OSS)", f"+{HYGA_SINK_GAIN:g} avg (HyGA ablation)", lambda d: {"sink": True}),
]

VARIANTS: dict[str, Preset] = {p.name: p for p in _PRESETS}


def get_variant(name: str) -> Preset:
    """The preset called ``name``; an unknown name lists the known ones."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise ConfigError(f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}") from None


# ---------------------------------------------------------------- CLI: gatedattn variants
def variant_costs(d_model: int, n_heads: int, n_kv_heads: int | None, head_dim: int | None,
                  seq_len: int, **fields: Any) -> list[dict[str, Any]]:
    """One row per preset: parameters and FLOPs of the layer and of its gate."""
    from gatedattn.layers.cost import cost  # lazy: --help must not import torch

    rows = []
    for preset in VARIANTS.values():
        cfg = preset(d_model, n_heads, n_kv_heads, head_dim, **fields)
        c = cost(cfg, seq_len)
        rows.append({
            "name": preset.name,
            "description": preset.description,
            "paper": preset.paper,
            "params": c.total_params,
            "gate_params": c.params["gate"],
            "flops": c.total_flops,
            "gate_flops": c.flops["gate"],
            "config": cfg.to_dict(),
        })
    return rows


def _format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'variant':<17} {'params':>10} {'gate params':>12} {'gate %':>7} {'GFLOPs':>9} {'gate MFLOPs':>12} {'gate %':>7}  description"
    lines = [header, "-" * len(header)]
    for r in rows:
        gp = 100 * r["gate_params"] / r["params"]
        gf = 100 * r["gate_flops"] / r["flops"]
        lines.append(
            f"{r['name']:<17} {r['params']:>10,} {r['gate_params']:>12,} {gp:>6.1f}% "
            f"{r['flops'] / 1e9:>9.3f} {r['gate_flops'] / 1e6:>12.2f} {gf:>6.2f}%  {r['description']}"
        )
    return "\n".join(lines)


def _run(args) -> int:
    for flag, value, high in (("--d-model", args.d_model, MODEL_LIMITS["d_model"]),
                              ("--n-heads", args.n_heads, MODEL_LIMITS["n_heads"]),
                              ("--n-kv-heads", args.n_kv_heads, MODEL_LIMITS["n_kv_heads"]),
                              ("--head-dim", args.head_dim, MODEL_LIMITS["head_dim"]),
                              ("--seq-len", args.seq_len, 1 << 31)):
        check_flag_range(flag, value, 1, high)  # before a weight of that size is built
    fields = {"kv": "mla"} if args.kv == "mla" else {}
    rows = variant_costs(args.d_model, args.n_heads, args.n_kv_heads, args.head_dim, args.seq_len, **fields)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"one attention layer: d_model={args.d_model} n_heads={args.n_heads} "
              f"n_kv_heads={args.n_kv_heads or args.n_heads} kv={args.kv} seq_len={args.seq_len}")
        print(_format_table(rows))
    return 0


def register(sub) -> None:
    p = sub.add_parser("variants", help="list every attention preset with its parameters and FLOPs")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--n-heads", type=int, default=16)
    p.add_argument("--n-kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--kv", choices=("gqa", "mla"), default="gqa")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per preset")
    p.set_defaults(func=_run)
