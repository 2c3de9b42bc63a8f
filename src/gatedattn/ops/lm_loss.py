"""The LM head and the next-token cross-entropy as one autograd function.

``linear_cross_entropy(h, W, targets) = cross_entropy((h @ W^T).float(), targets)``, the
loss of every language model: hidden states h (N, C) after the final norm, the head W
(V, C), targets (N,). Written as separate operations, a vocabulary of V = 49,152 and
N = 1,024 positions materialise the logits (N, V) in the matmul's dtype, their float32
copy, the log-softmax, its gradient and the gradient's cast back: five tensors of
200 MB in float32, each written and read once, which costs more than the head's matmul on
a CPU with fast bf16 matmuls. This function runs ``chunk`` vocabulary entries at a time
for every row, accumulating each row's log-sum-exp (N,); backward turns a chunk's logits
into ``softmax - onehot`` in place. It keeps the chunks' logits for backward, in the
products' dtype (one N x V tensor in pieces, where the unfused path holds five), while they
take at most ``KEEP_LOGITS_BYTES``; above that it keeps only the log-sum-exp and backward
recomputes each chunk's logits, one more product of the head's size (what keeping saves:
``docs/benchmarks/real-model.md``). The input's gradient is accumulated in float32; the head's is computed only where
``W`` requires it.

With a frozen head (the real-model study's arms) the input's gradient is taken in the same
pass as the loss: ``dL/dh = softmax @ W - W[target]`` is accumulated chunk by chunk as
``sum_j exp(logit_j - lse_so_far) W_j``, rescaled by ``exp(lse_old - lse_new)`` whenever
the running log-sum-exp grows (the online softmax of fused attention kernels). Backward
then only scales it by each row's incoming gradient: one product per chunk and half the
elementwise passes over the logits, instead of recomputing them.

Precision is the unfused path's: the matmul runs in the autocast dtype when autocast is
on (else in the inputs' dtype), the softmax in float32 (float64 for float64 inputs). ``ignore_index`` targets add
nothing and count in no mean, as in ``F.cross_entropy``.
``ops.reference.linear_cross_entropy`` is the plain specification; tests compare the two
forward and backward.
"""

from __future__ import annotations

import math

import torch

from gatedattn.ops.gate import _compute_dtype

CHUNK_ELEMENTS = 1 << 21  # logits per chunk (8 MB in float32): vocabulary entries per chunk = this // N
KEEP_LOGITS_BYTES = 1 << 28  # logits kept for backward at most (256 MiB); beyond, backward recomputes them


def _entries_per_chunk(rows: int, vocab: int, chunk: int | None) -> int:
    return chunk if chunk is not None else max(1, min(vocab, CHUNK_ELEMENTS // max(rows, 1)))


def _in_chunk(safe: torch.Tensor, v0: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which targets fall in the chunk of entries [v0, v0 + width), and their index in it
    (clamped into the chunk where they do not)."""
    return (safe >= v0) & (safe < v0 + width), (safe - v0).clamp(0, width - 1)


def _loss_and_input_grad(h: torch.Tensor, w: torch.Tensor, safe: torch.Tensor, lse: torch.Tensor,
                         picked: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over the vocabulary: each row's log-sum-exp and target logit, and the loss's
    gradient with respect to h (N, C), ``softmax @ w - w[target]``, in the softmax's dtype."""
    soft = lse.dtype
    acc = torch.zeros(h.shape, dtype=soft, device=h.device)  # sum_j exp(logit_j - lse) w_j
    for v0 in range(0, w.shape[0], chunk):
        wc = w[v0:v0 + chunk]
        logits = h @ wc.T  # (N, chunk) in the products' dtype, as the two-pass path
        top = logits.amax(-1).to(soft)
        e = torch.sub(logits, top[:, None]).to(soft).exp_()  # exp(logit - top) in the softmax's dtype
        new = torch.logaddexp(lse, top + e.sum(-1).log())
        acc.mul_(torch.exp(lse - new)[:, None])
        acc.add_((e.to(h.dtype) @ wc).to(soft).mul_(torch.exp(top - new)[:, None]))
        here, local = _in_chunk(safe, v0, wc.shape[0])
        picked += torch.where(here, logits.gather(1, local[:, None])[:, 0].to(soft), 0.0)
        lse = new
    return lse, picked, acc.sub_(w.index_select(0, safe).to(soft))


def _row_grad(ctx, grad_out: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's weight in the loss's gradient (N,): the incoming gradient, over the count
    of valid rows for a mean, zero on ignored rows."""
    if ctx.meta[2] == "none":
        return grad_out.to(dtype) * valid
    scale = grad_out.to(dtype) / ctx.count.clamp_min(1) if ctx.meta[2] == "mean" else grad_out.to(dtype)
    return valid.to(dtype) * scale


class _LinearCrossEntropy(torch.autograd.Function):
    """Chunks over the vocabulary: every chunk's slice of the head is a contiguous block of
    rows, packed once for its product (on a CPU, chunks of positions would repack the whole
    head for each), and the log-sum-exp is accumulated across chunks."""

    @staticmethod
    def forward(ctx, h_NC, weight_VC, targets_N, ignore_index, reduction, chunk, one_pass, keep):
        dtype = _compute_dtype(h_NC)
        h, w = h_NC.to(dtype), weight_VC.to(dtype)
        valid = targets_N != ignore_index
        safe = torch.where(valid, targets_N, 0)
        soft = torch.promote_types(dtype, torch.float32)  # the softmax's dtype: float32, or float64 inputs' own
        lse = torch.full((h.shape[0],), -math.inf, dtype=soft, device=h.device)
        picked = torch.zeros_like(lse)
        kept = []  # each chunk's logits in the products' dtype, where backward reads them
        with torch.autocast(h.device.type, enabled=False):
            if one_pass:
                lse, picked, grad_h = _loss_and_input_grad(h, w, safe, lse, picked, chunk)
            else:
                for v0 in range(0, w.shape[0], chunk):
                    raw = h @ w[v0:v0 + chunk].T  # (N, chunk)
                    if keep:
                        kept.append(raw)
                    logits = raw.to(soft)
                    torch.logaddexp(lse, torch.logsumexp(logits, -1), out=lse)
                    here, local = _in_chunk(safe, v0, logits.shape[1])
                    picked += torch.where(here, logits.gather(1, local[:, None])[:, 0], 0.0)
        losses = torch.where(valid, lse - picked, 0.0)
        if one_pass:
            ctx.save_for_backward(grad_h, valid)
        else:
            ctx.save_for_backward(h, w, safe, valid, lse, *kept)
        ctx.one_pass = one_pass
        ctx.meta = (h_NC.dtype, weight_VC.dtype, reduction, chunk)
        if reduction == "none":
            return losses
        count = valid.sum()
        ctx.count = count
        return losses.sum() / count if reduction == "mean" else losses.sum()  # mean of none: nan, as F

    @staticmethod
    def backward(ctx, grad_out):
        h_dtype, w_dtype, reduction, chunk = ctx.meta
        if ctx.one_pass:
            grad_h, valid = ctx.saved_tensors
            return (grad_h.mul_(_row_grad(ctx, grad_out, valid, grad_h.dtype)[:, None]).to(h_dtype),
                    None, None, None, None, None, None, None)
        h, w, safe, valid, lse, *kept = ctx.saved_tensors
        row_grad = _row_grad(ctx, grad_out, valid, lse.dtype)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.zeros(h.shape, dtype=lse.dtype, device=h.device) if need_h else None
        dw = torch.empty(w.shape, dtype=w_dtype, device=w.device) if need_w else None
        with torch.autocast(h.device.type, enabled=False):
            for i, v0 in enumerate(range(0, w.shape[0], chunk)):
                wc = w[v0:v0 + chunk]
                if kept:  # out of place: the kept logits stay as saved
                    probs = torch.sub(kept[i].to(lse.dtype), lse[:, None]).exp_()
                else:  # recomputed, then the softmax in place
                    probs = (h @ wc.T).to(lse.dtype).sub_(lse[:, None]).exp_()
                here, local = _in_chunk(safe, v0, wc.shape[0])
                probs.scatter_add_(1, local[:, None], -here.to(probs.dtype)[:, None])  # - onehot
                dlogits = probs.mul_(row_grad[:, None]).to(h.dtype)
                if need_h:
                    dh += dlogits @ wc
                if need_w:
                    dw[v0:v0 + chunk] = dlogits.T @ h
        return (None if dh is None else dh.to(h_dtype), dw, None, None, None, None, None, None)


def linear_cross_entropy(h_NC: torch.Tensor, weight_VC: torch.Tensor, targets_N: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean", chunk: int | None = None) -> torch.Tensor:
    """``F.cross_entropy((h @ weight.T).float(), targets)`` without its (N, V) float32
    copies (the products' logits kept for backward up to :data:`KEEP_LOGITS_BYTES`, else
    recomputed): h (N, C), weight (V, C), targets (N,) int64; ``reduction`` mean, sum or
    none (N,)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r} must be one of mean, sum, none")
    if h_NC.dim() != 2 or weight_VC.dim() != 2 or h_NC.shape[1] != weight_VC.shape[1]:
        raise ValueError(f"linear_cross_entropy takes h (N, C) and weight (V, C), got {tuple(h_NC.shape)} and "
                         f"{tuple(weight_VC.shape)}")
    if targets_N.shape != h_NC.shape[:1]:
        raise ValueError(f"targets must be (N,) = ({h_NC.shape[0]},), got {tuple(targets_N.shape)}")
    chunk = _entries_per_chunk(h_NC.shape[0], weight_VC.shape[0], chunk)
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    # a frozen head under gradients: the input's gradient is taken in the loss's own pass
    one_pass = torch.is_grad_enabled() and h_NC.requires_grad and not weight_VC.requires_grad
    # a head trained too: the logits kept for backward while they fit the budget, in the products' dtype
    keep = (torch.is_grad_enabled() and weight_VC.requires_grad
            and h_NC.shape[0] * weight_VC.shape[0] * _compute_dtype(h_NC).itemsize <= KEEP_LOGITS_BYTES)
    return _LinearCrossEntropy.apply(h_NC, weight_VC, targets_N, ignore_index, reduction, chunk, one_pass, keep)
