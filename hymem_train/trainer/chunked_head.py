"""Memory-lean LM head: what the losses need from the logits, without ever holding `[tokens, vocab]`.

At the report's context (28,672 prompt + 4,096 response tokens, vocab 120,832) the full fp32 logits
of one packed row are ~16 GB, and autograd would keep two more copies for log_softmax and its
gradient. Both losses only need, per loss position, the log-normalizer, the logits at a handful of
token ids (the sampled token for PPO, the teacher's top-50 for OPD) and the entropy. This module
computes exactly those in row chunks and recomputes each chunk's logits in backward, the scheme of
Cut Cross-Entropy / Liger's fused linear cross-entropy (both ship Triton-only kernels, so they do not
serve the CPU path; this is the portable PyTorch version).

Legend: T tokens of a packed row, N loss positions, H hidden, V vocab, K gathered ids per position,
R rows and B vocab entries per tile.
"""

from __future__ import annotations

import torch

DEFAULT_BLOCK_ROWS = 4096  # loss positions per tile: W is read (and its gradient written) once per row block
DEFAULT_BLOCK_VOCAB = 2048  # vocab entries per tile: 4096 x 2048 fp32 = 32 MB per tile buffer


def _tiles(n: int, block: int):
    for s in range(0, n, block):
        yield s, min(n, s + block)


def _logits(h_RH: torch.Tensor, w_BH: torch.Tensor, inv_t: float) -> torch.Tensor:
    z_RB = (h_RH @ w_BH.T).float()
    return z_RB.mul_(inv_t) if inv_t != 1.0 else z_RB


def _local_ids(ids_RK: torch.Tensor, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
    local_RK = ids_RK - v0
    inside_RK = (local_RK >= 0) & (local_RK < v1 - v0)
    return local_RK.clamp_(0, v1 - v0 - 1), inside_RK


def _acc_mm(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b, in place without a temporary when the dtypes agree."""
    if out.dtype == a.dtype:
        out.addmm_(a, b)
    else:
        out.add_(a @ b)


class _ChunkedHead(torch.autograd.Function):
    """(hidden_NH, weight_VH, ids_NK) -> (lse_N, gathered_NK, entropy_N), all fp32.

    Tiled over (row block R, vocab block B). Forward keeps an online log-sum-exp across vocab
    blocks (running max m, s1 = sum e^(z-m), s2 = sum e^(z-m) z; entropy = lse - s2/s1); backward
    recomputes each tile's logits from the saved per-row lse and entropy, so every tile is
    independent and the weight gradient of a vocab block is written once per row block.
    """

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, ids_NK, block_rows, block_vocab, inv_t, with_entropy):
        N, K = ids_NK.shape
        V = weight_VH.shape[0]
        dev = hidden_NH.device
        lse_N = torch.empty(N, dtype=torch.float32, device=dev)
        gathered_NK = torch.zeros(N, K, dtype=torch.float32, device=dev)
        entropy_N = torch.zeros(N, dtype=torch.float32, device=dev)
        for r0, r1 in _tiles(N, block_rows):
            h_RH, ids_RK = hidden_NH[r0:r1], ids_NK[r0:r1]
            m_R = torch.full((r1 - r0,), float("-inf"), dtype=torch.float32, device=dev)
            s1_R = torch.zeros_like(m_R)
            s2_R = torch.zeros_like(m_R)
            for v0, v1 in _tiles(V, block_vocab):
                z_RB = _logits(h_RH, weight_VH[v0:v1], inv_t)
                local_RK, inside_RK = _local_ids(ids_RK, v0, v1)
                gathered_NK[r0:r1] += torch.where(inside_RK, z_RB.gather(1, local_RK), 0.0)
                new_m_R = torch.maximum(m_R, z_RB.amax(-1))
                rescale_R = (m_R - new_m_R).exp()
                e_RB = (z_RB - new_m_R[:, None]).exp_()
                s1_R.mul_(rescale_R).add_(e_RB.sum(-1))
                if with_entropy:
                    s2_R.mul_(rescale_R).add_(e_RB.mul_(z_RB).sum(-1))
                m_R = new_m_R
                del z_RB, e_RB
            lse_N[r0:r1] = m_R + s1_R.log()
            if with_entropy:
                entropy_N[r0:r1] = lse_N[r0:r1] - s2_R / s1_R
        ctx.save_for_backward(hidden_NH, weight_VH, ids_NK, lse_N, entropy_N)
        ctx.blocks = (block_rows, block_vocab)
        ctx.inv_t = inv_t
        ctx.with_entropy = with_entropy
        ctx.mark_non_differentiable(ids_NK)
        return lse_N, gathered_NK, entropy_N

    @staticmethod
    def backward(ctx, g_lse_N, g_gathered_NK, g_entropy_N):
        hidden_NH, weight_VH, ids_NK, lse_N, entropy_N = ctx.saved_tensors
        (block_rows, block_vocab), inv_t = ctx.blocks, ctx.inv_t
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        N, V = hidden_NH.shape[0], weight_VH.shape[0]
        # Accumulate in fp32 when the model runs bf16: grad_hidden sums over every vocab tile (60 at
        # the report's vocab), which a bf16 buffer would round at each step.
        wide = torch.float32 if hidden_NH.dtype in (torch.bfloat16, torch.float16) else hidden_NH.dtype
        grad_hidden_NH = torch.zeros(hidden_NH.shape, dtype=wide, device=hidden_NH.device) if need_h else None
        w_dtype = weight_VH.dtype if block_rows >= N else wide  # one row block: each tile written once
        grad_weight_VH = (
            torch.zeros(weight_VH.shape, dtype=w_dtype, device=weight_VH.device) if need_w else None
        )
        for r0, r1 in _tiles(N, block_rows):
            h_RH, ids_RK = hidden_NH[r0:r1], ids_NK[r0:r1]
            lse_R1, ent_R1 = lse_N[r0:r1, None], entropy_N[r0:r1, None]
            g_lse_R1, g_ent_R1 = g_lse_N[r0:r1, None], g_entropy_N[r0:r1, None]
            for v0, v1 in _tiles(V, block_vocab):
                logp_RB = _logits(h_RH, weight_VH[v0:v1], inv_t).sub_(lse_R1)
                gz_RB = logp_RB.exp()  # p
                if ctx.with_entropy:
                    # dH/dz_j = -p_j (log p_j + H)
                    logp_RB.add_(ent_R1).mul_(gz_RB).mul_(g_ent_R1.neg())
                    gz_RB.mul_(g_lse_R1).add_(logp_RB)
                else:
                    gz_RB.mul_(g_lse_R1)
                del logp_RB
                local_RK, inside_RK = _local_ids(ids_RK, v0, v1)
                gz_RB.scatter_add_(1, local_RK, torch.where(inside_RK, g_gathered_NK[r0:r1], 0.0))
                if inv_t != 1.0:
                    gz_RB.mul_(inv_t)
                gz_RB = gz_RB.to(hidden_NH.dtype)
                if need_h:
                    _acc_mm(grad_hidden_NH[r0:r1], gz_RB, weight_VH[v0:v1])
                if need_w:
                    _acc_mm(grad_weight_VH[v0:v1], gz_RB.T, h_RH)
                del gz_RB
        if need_h:
            grad_hidden_NH = grad_hidden_NH.to(hidden_NH.dtype)
        if need_w:
            grad_weight_VH = grad_weight_VH.to(weight_VH.dtype)
        return grad_hidden_NH, grad_weight_VH, None, None, None, None, None


def chunked_head(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    ids_NK: torch.Tensor,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    block_vocab: int = DEFAULT_BLOCK_VOCAB,
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
    if block_rows < 1 or block_vocab < 1:
        raise ValueError(
            f"chunked_head: block_rows / block_vocab must be >= 1, got {block_rows} / {block_vocab}"
        )
    if temperature <= 0:
        raise ValueError(f"chunked_head: temperature must be > 0, got {temperature}")
    return _ChunkedHead.apply(
        hidden_NH,
        weight_VH,
        ids_NK.long(),
        int(block_rows),
        int(block_vocab),
        1.0 / float(temperature),
        bool(with_entropy),
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
