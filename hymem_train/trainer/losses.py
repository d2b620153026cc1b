"""OPD and PPO losses as pure functions of small per-position tensors.

The big `[tokens, vocab]` part lives in `chunked_head.py`; these functions only see what it returns
(`lse_N`, logits gathered at a few ids, entropy) and are cheap enough to be tested by hand.

Legend: N loss positions (response tokens of the micro-batch), K teacher top-k (50 in the report).
"""

from __future__ import annotations

import torch

from hymem_train.trainer.config import OPD_FORMS

_EPS = 1e-12


def opd_token_loss(
    student_lse_N: torch.Tensor,
    student_topk_logits_NK: torch.Tensor,
    teacher_topk_logprobs_NK: torch.Tensor,
    student_entropy_N: torch.Tensor,
    *,
    form: str = "report",
    entropy_coef: float = 0.005,
) -> torch.Tensor:
    """Per-position OPD loss: reverse KL over the teacher's top-k support minus the entropy bonus.

    report: `sum_{v in topk} p_s(v) (log p_s(v) - log p_t(v))` (report section OPD).
    tail:   the same plus the (k+1)-th bucket `q_s log(q_s / q_t)` with `q = 1 - sum_topk p`. Without it
            the truncated KL can be lowered by moving student mass *out* of the support (a student with
            no mass on the support has KL 0); the bucket form is a proper KL between (k+1)-way
            distributions and is >= 0.
    """
    if form not in OPD_FORMS:
        raise ValueError(f"opd_token_loss: form={form!r}, want one of {OPD_FORMS}")
    ls_NK = student_topk_logits_NK - student_lse_N[:, None]
    ps_NK = ls_NK.exp()
    kl_N = (ps_NK * (ls_NK - teacher_topk_logprobs_NK)).sum(-1)
    if form == "tail":
        qs_N = (1.0 - ps_NK.sum(-1)).clamp_min(_EPS)
        qt_N = (1.0 - teacher_topk_logprobs_NK.exp().sum(-1)).clamp_min(_EPS)
        kl_N = kl_N + qs_N * (qs_N.log() - qt_N.log())
    return kl_N - entropy_coef * student_entropy_N


@torch.no_grad()
def opd_support_stats(
    student_lse_N: torch.Tensor,
    student_topk_logits_NK: torch.Tensor,
    teacher_topk_ids_NK: torch.Tensor,
    teacher_topk_logprobs_NK: torch.Tensor,
    target_ids_N: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Sums (not means) over positions, so micro-batches and ranks reduce by addition.

    student/teacher mass on the support shows the truncated-KL pitfall (student mass shrinking);
    coverage is the share of student-sampled tokens inside the teacher's top-k (silent failure teacher-without-topk:
    a teacher that silently returns garbage top-k shows up as coverage collapsing).
    """
    ps_N = (student_topk_logits_NK - student_lse_N[:, None]).exp().sum(-1)
    pt_N = teacher_topk_logprobs_NK.exp().sum(-1)
    covered_N = (teacher_topk_ids_NK == target_ids_N[:, None]).any(-1)
    return {
        "student_mass_sum": ps_N.sum(),
        "teacher_mass_sum": pt_N.sum(),
        "coverage_sum": covered_N.float().sum(),
        "count": torch.tensor(float(ps_N.numel())),
    }


def ppo_token_loss(
    logp_N: torch.Tensor,
    old_logp_N: torch.Tensor,
    advantage_N: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per position (to minimise) and the clipped indicator (for clipfrac).

    `-min(r A, clip(r, 1-lo, 1+hi) A)`; with dual clip, for A < 0 the loss is capped at `-c A`, which
    bounds the update when a stale token's ratio explodes. No KL term (report, RL objective).
    """
    ratio_N = (logp_N - old_logp_N).exp()
    surr1_N = ratio_N * advantage_N
    surr2_N = ratio_N.clamp(1.0 - clip_low, 1.0 + clip_high) * advantage_N
    loss_N = -torch.minimum(surr1_N, surr2_N)
    clipped_N = (surr2_N < surr1_N).detach()
    if dual_clip is not None:
        capped_N = torch.minimum(loss_N, -dual_clip * advantage_N)
        loss_N = torch.where(advantage_N < 0, capped_N, loss_N)
    return loss_N, clipped_N


@torch.no_grad()
def ppo_clip_sides(
    logp_N: torch.Tensor,
    old_logp_N: torch.Tensor,
    advantage_N: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which side of the clip is active in `ppo_token_loss` per position: (low_N, high_N), bool.

    low: A < 0 and r < 1 - clip_low (the lower bound takes the gradient away from a token the
    update already made less likely); high: A > 0 and r > 1 + clip_high. Together they are exactly
    `ppo_token_loss`'s clipped indicator (A = 0 clips nothing).
    """
    ratio_N = (logp_N - old_logp_N).exp()
    low_N = (advantage_N < 0) & (ratio_N < 1.0 - clip_low)
    high_N = (advantage_N > 0) & (ratio_N > 1.0 + clip_high)
    return low_N, high_N


def sft_token_loss(lse_N: torch.Tensor, target_logits_N: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per position: `lse - z[target]`."""
    return lse_N - target_logits_N


def sequence_mean_weights(num_tokens_S: torch.Tensor) -> torch.Tensor:
    """Per-sequence token weight for "mean over tokens within each sequence, then mean over sequences".

    `sum_tokens w * l` with `w = 1 / (n_s * S)` equals that double mean. Computed once for the whole
    optimizer step (all micro-batches, all ranks), so the result does not depend on how the step is
    split (report, RL objective; the invariance tests check it).
    """
    if (num_tokens_S <= 0).any():
        raise ValueError("sequence_mean_weights: every sequence needs >= 1 loss token")
    return 1.0 / (num_tokens_S.double() * num_tokens_S.numel())


def token_mean_weight(num_tokens_total: int) -> float:
    """Per-token weight for a plain mean over all loss positions of the step (OPD, SFT)."""
    if num_tokens_total <= 0:
        raise ValueError("token_mean_weight: the step has no loss token")
    return 1.0 / num_tokens_total
