"""The calls ``gatedattn bench`` times, built from configs (nothing is downloaded).

Four kinds per shape, each a dict ``name -> Workload``:

- ``layer``: one attention layer, forward and backward, on (batch, seq_len, d_model);
- ``train``: one step of the trainer (``Trainer.train_step``, see ``step.py``) of a small ``GatedLM``;
- ``decode`` / ``prefill``: greedy cached generation of ``decode_new`` tokens / of one token
  after the same prompt (their difference is the decoding cost alone).

Our variants are named by their preset. Beside them, what users would use instead, from
transformers: ``Qwen3NextAttention`` and ``GptOssAttention`` layers, each next to our layer
converted from it (same weights, same computation: ``gatedattn.hf.attention_from_*``), and a
``Qwen3ForCausalLM`` of exactly our baseline model's configuration (``hf_config_for``) for
training and ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gatedattn.bench.config import Shape
from gatedattn.bench.step import LogitsOf, step_trainer
from gatedattn.layers.config import AttentionConfig, RopeConfig
from gatedattn.infra.precision import Precision
from gatedattn.layers.variants import get_variant
from gatedattn.hf import attention_from_gpt_oss, attention_from_qwen3_next
from gatedattn.hf.export import hf_config_for
from gatedattn.layers.attention import Attention
from gatedattn.models.lm import GatedLM, ModelConfig

HF_QWEN3_NEXT = "hf:Qwen3NextAttention"
OURS_QWEN3_NEXT = "ours:gated-from-Qwen3Next"
HF_GPT_OSS = "hf:GptOssAttention"
OURS_GPT_OSS = "ours:sink-from-GptOss"
HF_QWEN3 = "hf:Qwen3ForCausalLM"
KINDS = ("layer", "train", "decode", "prefill")
RECOMPILE_LIMIT = 64


@dataclass
class Workload:
    """One timed call. ``tokens`` it processes per call; ``params`` the trainable tensors it
    updates or differentiates; ``resident()`` every tensor it keeps between calls
    (parameters, optimizer state); ``eager`` the uncompiled call (for the CPU memory meter)."""

    run: Callable[[], Any]
    tokens: int
    params: list[torch.Tensor] = field(default_factory=list)
    resident: Callable[[], list[torch.Tensor]] = lambda: []
    eager: Callable[[], Any] | None = None
    flops_config: AttentionConfig | None = None


@dataclass
class Context:
    shape: Shape
    precision: Precision
    device: torch.device
    compile: bool

    def maybe_compile(self, fn):
        """``torch.compile(fn)`` when compiling. Every variant's layer shares one ``forward``
        (and every model one ``loss``): raise dynamo's per-function recompile limit so that
        none of them silently falls back to eager after the 8th."""
        if not self.compile:
            return fn
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
        return torch.compile(fn)


def attention_config(shape: Shape, variant: str) -> AttentionConfig:
    """The bench's config of ``variant``: Qwen3-style (q/k RMSNorm), full RoPE."""
    return get_variant(variant)(shape.d_model, shape.n_heads, shape.n_kv_heads, qk_norm=True,
                                rope=RopeConfig(original_max_len=shape.seq_len))


def model_config(shape: Shape, variant: str):
    return ModelConfig(vocab_size=shape.vocab_size, n_layers=shape.n_layers, attention=attention_config(shape, variant),
                       ffn_dim=shape.ffn_dim, variant=variant, max_seq_len=shape.seq_len)


# --------------------------------------------------------------------------- layers
def _layer_workload(ctx: Context, module: nn.Module, call: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                    cfg: AttentionConfig | None) -> Workload:
    s = ctx.shape
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(s.batch, s.seq_len, s.d_model, generator=gen).to(ctx.device).requires_grad_()
    dy = torch.randn(s.batch, s.seq_len, s.d_model, generator=gen).to(ctx.device)
    compiled = ctx.maybe_compile(module)
    params = [p for p in module.parameters() if p.requires_grad]

    def make(fn):
        def run():
            with ctx.precision.autocast(ctx.device):
                y = call(fn, x)
            y.backward(dy)
            module.zero_grad(set_to_none=True)
            x.grad = None
        return run

    return Workload(make(compiled), s.batch * s.seq_len, params=[*params, x], resident=lambda: list(params),
                    eager=make(module), flops_config=cfg)


def our_layer(ctx: Context, variant: str) -> Workload:
    torch.manual_seed(0)
    cfg = attention_config(ctx.shape, variant)
    return _layer_workload(ctx, Attention(cfg).to(ctx.device), lambda m, x: m(x), cfg)


def hf_layers(ctx: Context) -> dict[str, Workload]:
    """Qwen3NextAttention and GptOssAttention, each with our layer converted from it."""
    from transformers import GptOssConfig, Qwen3NextConfig  # lazy: heavy (transformers)
    # lazy: heavy (transformers)
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
    # lazy: heavy (transformers)
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    s, dev = ctx.shape, ctx.device
    shape = dict(hidden_size=s.d_model, num_attention_heads=s.n_heads, num_key_value_heads=s.n_kv_heads,
                 head_dim=s.d_model // s.n_heads, vocab_size=s.vocab_size, max_position_embeddings=s.seq_len,
                 rms_norm_eps=1e-6)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    positions = torch.arange(s.seq_len, device=dev)[None].expand(s.batch, -1)
    out: dict[str, Workload] = {}

    torch.manual_seed(0)
    qn = Qwen3NextConfig(**shape, num_hidden_layers=1, rope_parameters={**rope, "partial_rotary_factor": 1.0})
    qn._attn_implementation = "sdpa"  # causal SDPA (no mask tensor), as in the model
    hf = Qwen3NextAttention(qn, 0).to(dev)
    cos_sin = _rotary(Qwen3NextRotaryEmbedding(qn).to(dev), s, positions, dev)
    out[HF_QWEN3_NEXT] = _layer_workload(ctx, hf, lambda m, x: m(x, cos_sin, None)[0], None)
    ours = attention_from_qwen3_next(hf, qn).to(dev)
    out[OURS_QWEN3_NEXT] = _layer_workload(ctx, ours, lambda m, x: m(x), ours.cfg)

    torch.manual_seed(0)
    go = GptOssConfig(**shape, num_hidden_layers=1, layer_types=["full_attention"], rope_parameters=rope,
                      num_local_experts=2, num_experts_per_tok=1, intermediate_size=s.ffn_dim)
    go._attn_implementation = "eager"  # transformers' GPT-OSS does not support SDPA (the sink)
    hf = GptOssAttention(go, 0).to(dev)
    cos_sin = _rotary(GptOssRotaryEmbedding(go).to(dev), s, positions, dev)
    mask = torch.full((s.seq_len, s.seq_len), float("-inf"), device=dev).triu(1)[None, None]  # (1, 1, T, T)
    out[HF_GPT_OSS] = _layer_workload(ctx, hf, lambda m, x: m(x, cos_sin, mask)[0], None)
    ours = attention_from_gpt_oss(hf, go).to(dev)
    out[OURS_GPT_OSS] = _layer_workload(ctx, ours, lambda m, x: m(x), ours.cfg)
    return out


def _rotary(rotary: nn.Module, s: Shape, positions: torch.Tensor, dev: torch.device):
    """cos/sin computed once, as a model computes them once for all its layers."""
    with torch.no_grad():
        return rotary(torch.zeros(s.batch, s.seq_len, s.d_model, device=dev), positions)


# --------------------------------------------------------------------------- models
def _batch(shape: Shape, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, shape.vocab_size, (shape.batch, shape.seq_len + 1), generator=gen).to(device)


def _train_workload(ctx: Context, model: nn.Module) -> Workload:
    """The trainer's own step of ``model`` (compiled with ``--compile``; the eager trainer
    shares the parameters and serves the CPU memory meter)."""
    batch = _batch(ctx.shape, ctx.device)
    trainer = step_trainer(model, batch, ctx.shape.vocab_size, ctx.precision, ctx.device)
    compiled = trainer
    if ctx.compile:
        compiled = step_trainer(ctx.maybe_compile(model), batch, ctx.shape.vocab_size, ctx.precision, ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]

    def resident() -> list[torch.Tensor]:
        opts = {id(t.opt): t.opt for t in (trainer, compiled)}.values()
        state = [t for opt in opts for o in opt.optimizers for st in o.state.values() for t in st.values()
                 if isinstance(t, torch.Tensor)]
        return [*params, *state]

    return Workload(compiled.train_step, ctx.shape.batch * ctx.shape.seq_len, params=params, resident=resident,
                    eager=trainer.train_step)


def _decode_workloads(ctx: Context, generate: Callable[[torch.Tensor, int], torch.Tensor]) -> tuple[Workload, Workload]:
    s = ctx.shape
    prompt = _batch(s, ctx.device)[:, : s.decode_prompt]

    def make(n: int):
        def run():
            with ctx.precision.autocast(ctx.device):
                out = generate(prompt, n)
            if out.shape != (s.batch, s.decode_prompt + n):
                raise RuntimeError(f"generation returned shape {tuple(out.shape)}, expected {(s.batch, s.decode_prompt + n)}")
        return run

    return Workload(make(s.decode_new), s.batch * s.decode_new), Workload(make(1), s.batch)


def our_model(ctx: Context, variant: str) -> dict[str, Workload]:
    """Training step, decoding and prefill workloads of a ``GatedLM`` with ``variant``."""
    torch.manual_seed(0)
    model = GatedLM(model_config(ctx.shape, variant)).to(ctx.device).train()
    decode, prefill = _decode_workloads(
        ctx, lambda ids, n: model.generate(ids, n, temperature=0, use_cache=True))
    return {"train": _train_workload(ctx, model), "decode": decode, "prefill": prefill}


def hf_model(ctx: Context) -> dict[str, Workload]:
    """The same three workloads for ``Qwen3ForCausalLM`` with our baseline model's config."""
    from transformers import Qwen3ForCausalLM  # lazy: heavy (transformers)
    from transformers.utils import logging as hf_logging  # lazy: heavy (transformers)

    hf_logging.set_verbosity_error()
    config = hf_config_for(model_config(ctx.shape, "baseline"))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(ctx.device).train()

    def generate(ids: torch.Tensor, n: int) -> torch.Tensor:
        was = model.training
        model.eval()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
        model.train(was)
        return out

    decode, prefill = _decode_workloads(ctx, generate)
    return {"train": _train_workload(ctx, LogitsOf(model)), "decode": decode, "prefill": prefill}


def build(ctx: Context, variants: tuple[str, ...], hf: bool) -> dict[str, dict[str, Workload]]:
    """Every workload of one shape: kind -> name -> Workload (our variants first)."""
    kinds: dict[str, dict[str, Workload]] = {k: {} for k in KINDS}
    for v in variants:
        kinds["layer"][v] = our_layer(ctx, v)
        for kind, w in our_model(ctx, v).items():
            kinds[kind][v] = w
    if hf:
        kinds["layer"].update(hf_layers(ctx))
        for kind, w in hf_model(ctx).items():
            kinds[kind][HF_QWEN3] = w
    return kinds
