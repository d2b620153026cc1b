"""Memory-lean LM head: what the losses need from the logits, without ever holding `[tokens, vocab]`.

At the report's context (28,672 prompt + 4,096 response tokens, vocab 120,832) the full fp32 logits
of one packed row are ~16 GB, and autograd would keep two more copies for log_softmax and its
gradient. Both losses only need, per loss position, the log-normalizer, the logits at a handful of
token ids (the sampled token for PPO, the teacher's top-50 for OPD) and the entropy. This module
computes exactly those in row chunks and recomputes each chunk's logits in backward, the scheme of
Cut Cross-Entropy / Liger's fused linear cross-entropy (both ship Triton-only kernels, so they do not
serve the CPU path; this is the portable PyTorch version).

Legend: T tokens of a packed row, N loss positions, H hidden, V vocab, K gathered ids per position,
C rows per chunk.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_ROWS = 128  # 128 x 120,832 fp32 = 62 MB per chunk buffer at the report's vocab


class _ChunkedHead(torch.autograd.Function):
    """(hidden_NH, weight_VH, ids_NK) -> (lse_N, gathered_NK, entropy_N), all fp32."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, ids_NK, chunk_rows, inv_temperature, with_entropy):
        N = hidden_NH.shape[0]
        K = ids_NK.shape[1]
        dev = hidden_NH.device
        lse_N = torch.empty(N, dtype=torch.float32, device=dev)
        gathered_NK = torch.empty(N, K, dtype=torch.float32, device=dev)
        entropy_N = torch.zeros(N, dtype=torch.float32, device=dev)
        for s in range(0, N, chunk_rows):
            e = min(N, s + chunk_rows)
            z_CV = (hidden_NH[s:e] @ weight_VH.T).float()
            if inv_temperature != 1.0:
                z_CV.mul_(inv_temperature)
            lse_C = torch.logsumexp(z_CV, dim=-1)
            lse_N[s:e] = lse_C
            gathered_NK[s:e] = z_CV.gather(1, ids_NK[s:e])
            if with_entropy:
                # H = lse - sum_v p_v z_v; reuse the chunk buffer for p to keep two C x V buffers at most
                pz_C = torch.softmax(z_CV, dim=-1).mul_(z_CV).sum(-1)
                entropy_N[s:e] = lse_C - pz_C
            del z_CV
        ctx.save_for_backward(hidden_NH, weight_VH, ids_NK, lse_N, entropy_N)
        ctx.chunk_rows = chunk_rows
        ctx.inv_temperature = inv_temperature
        ctx.with_entropy = with_entropy
        ctx.mark_non_differentiable(ids_NK)
        return lse_N, gathered_NK, entropy_N

    @staticmethod
    def backward(ctx, g_lse_N, g_gathered_NK, g_entropy_N):
        hidden_NH, weight_VH, ids_NK, lse_N, entropy_N = ctx.saved_tensors
        C, inv_t = ctx.chunk_rows, ctx.inv_temperature
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden_NH = torch.zeros_like(hidden_NH) if need_h else None
        grad_weight_VH = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        N = hidden_NH.shape[0]
        for s in range(0, N, C):
            e = min(N, s + C)
            h_CH = hidden_NH[s:e]
            logp_CV = (h_CH @ weight_VH.T).float()
            if inv_t != 1.0:
                logp_CV.mul_(inv_t)
            logp_CV.sub_(lse_N[s:e, None])
            gz_CV = logp_CV.exp()  # p
            if ctx.with_entropy:
                # dH/dz_j = -p_j (log p_j + H)
                logp_CV.add_(entropy_N[s:e, None]).mul_(gz_CV).mul_(-g_entropy_N[s:e, None])
                gz_CV.mul_(g_lse_N[s:e, None]).add_(logp_CV)
            else:
                gz_CV.mul_(g_lse_N[s:e, None])
            del logp_CV
            gz_CV.scatter_add_(1, ids_NK[s:e], g_gathered_NK[s:e])
            if inv_t != 1.0:
                gz_CV.mul_(inv_t)
            gz_CV = gz_CV.to(hidden_NH.dtype)
            if need_h:
                grad_hidden_NH[s:e] = gz_CV @ weight_VH
            if need_w:
                grad_weight_VH.addmm_(gz_CV.T.float(), h_CH.float())
            del gz_CV
        if need_w:
            grad_weight_VH = grad_weight_VH.to(weight_VH.dtype)
        return grad_hidden_NH, grad_weight_VH, None, None, None, None


def chunked_head(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    ids_NK: torch.Tensor,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per loss position: log-normalizer `lse_N`, logits at `ids_NK` and entropy (zeros if not asked).

    `log p(ids) = gathered_NK - lse_N[:, None]`. Gradients flow to `hidden_NH` and `weight_VH`.
    `temperature` divides the logits, as the rollout engine sampled with it (the importance ratio must
    compare log-probs of the same distribution the engine reported).
    """
    if hidden_NH.ndim != 2 or ids_NK.ndim != 2 or ids_NK.shape[0] != hidden_NH.shape[0]:
        raise ValueError(
            f"chunked_head: want hidden [N, H] and ids [N, K], got {tuple(hidden_NH.shape)} and {tuple(ids_NK.shape)}"
        )
    if chunk_rows < 1:
        raise ValueError(f"chunked_head: chunk_rows must be >= 1, got {chunk_rows}")
    if temperature <= 0:
        raise ValueError(f"chunked_head: temperature must be > 0, got {temperature}")
    return _ChunkedHead.apply(
        hidden_NH, weight_VH, ids_NK.long(), int(chunk_rows), 1.0 / float(temperature), bool(with_entropy)
    )


def naive_head(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    ids_NK: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference: the same three outputs from the full `[N, V]` logits (parity tests and benchmark only)."""
    z_NV = (hidden_NH @ weight_VH.T).float() / temperature
    lse_N = torch.logsumexp(z_NV, dim=-1)
    logp_NV = torch.log_softmax(z_NV, dim=-1)
    entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return lse_N, z_NV.gather(1, ids_NK.long()), entropy_N
