"""KV-cache bytes per token of a model, whatever its caches hold.

``cache_bytes_per_token`` decodes a prompt and a few single tokens through ``GatedLM``'s
caches, then sums the storages of every tensor reachable from the cache objects (each
storage once) and divides by the tokens cached. It does not assume the cache's layout, so
it measures expanded keys/values, a latent, or a preallocated buffer alike.
"""

from __future__ import annotations

import torch

from gatedattn.bench.memory import tensors_in, unique_storage_bytes
from gatedattn.bench.workloads import model_config
from gatedattn.layers.config import MLAConfig
from gatedattn.models.lm import GatedLM


@torch.no_grad()
def cache_bytes_per_token(model, *, prompt: int = 8, steps: int = 4, batch: int = 1) -> dict:
    """Decode ``prompt`` tokens then ``steps`` single tokens; bytes the caches hold, per
    cached token (all layers) and per token per layer."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, prompt + steps), generator=gen).to(device)
    caches = model.new_cache()
    model(ids[:, :prompt], caches=caches)
    for i in range(prompt, prompt + steps):
        model(ids[:, i:i + 1], caches=caches)
    held = unique_storage_bytes(tensors_in(caches))
    tokens = batch * (prompt + steps)
    return {"bytes": held, "tokens": tokens, "bytes_per_token": held / tokens,
            "bytes_per_token_per_layer": held / tokens / len(caches),
            "dtype_bytes": next(model.parameters()).element_size()}


def mla_vs_gqa(shape) -> dict:
    """Cache bytes per token of an MLA model and of a GQA model (half as many KV heads as
    query heads, at least one) of the bench shape, and their ratio."""
    base = model_config(shape, "baseline")
    head_dim = shape.d_model // shape.n_heads
    gqa_att = base.attention.replace(n_kv_heads=max(1, shape.n_heads // 2))
    mla_att = base.attention.replace(kv="mla", qk_norm=False,
                                     mla=MLAConfig(kv_rank=max(2, shape.d_model // 2), rope_dim=max(2, head_dim // 2)))
    out = {}
    for name, att in (("gqa", gqa_att), ("mla", mla_att)):
        torch.manual_seed(0)
        model = GatedLM(base.replace(attention=att))
        out[name] = {"attention": {k: v for k, v in att.to_dict().items() if k in ("n_heads", "n_kv_heads", "head_dim", "kv", "mla")},
                     **cache_bytes_per_token(model)}
    out["mla_over_gqa"] = out["mla"]["bytes_per_token"] / out["gqa"]["bytes_per_token"]
    return out
