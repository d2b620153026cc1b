"""The training forward: packed micro-batch -> hidden states -> chunked LM head -> weighted loss.

Wraps the HF model in the module DeepSpeed trains, because the loss reads `lm_head.weight` outside
`lm_head.forward` (the full logits are never formed): under ZeRO-3 that parameter is registered as
an external parameter of this module so DeepSpeed gathers it for our forward and backward.

Legend: T tokens of the packed row, H hidden, N loss positions, K gathered ids per position.
"""

from __future__ import annotations

import torch
from torch import nn

from hymem_train.trainer.chunked_head import chunked_head
from hymem_train.trainer.config import LossConfig
from hymem_train.trainer.losses import (
    opd_support_stats,
    opd_token_loss,
    ppo_clip_sides,
    ppo_token_loss,
    sft_token_loss,
)
from hymem_train.trainer.packing import MicroBatch, block_causal_mask
from hymem_train.trainer.segment_attention import KWARG as SEGMENTS_KWARG
from hymem_train.trainer.segment_attention import use_segment_attention


class PolicyLoss(nn.Module):
    """`forward(mb) -> (loss, stats)`; `stats` are detached sums that reduce across micro-batches/ranks."""

    def __init__(self, model: nn.Module, loss_cfg: LossConfig, mask_mode: str = "segments"):
        super().__init__()
        self.model = model
        if mask_mode == "segments":
            use_segment_attention(model)
        self.loss_cfg = loss_cfg
        self.mask_mode = mask_mode
        self.loss_scale = 1.0  # set by the engine: data-parallel world size (see engine.py)

    def hidden_states(self, mb: MicroBatch) -> torch.Tensor:
        kw: dict = {}
        if self.mask_mode == "segments":
            kw[SEGMENTS_KWARG] = mb.cu_seqlens
        elif self.mask_mode == "block_causal":
            kw["attention_mask"] = block_causal_mask(mb.segment_ids_T, self.model.lm_head.weight.dtype)
        out = self.model.model(input_ids=mb.input_ids_1T, position_ids=mb.position_ids_1T, **kw)
        return out.last_hidden_state[0]

    def _token_logprobs(self, hidden_TH: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        """log p(target) at the loss positions (old policy for PPO `ratio_source: recompute`)."""
        lse_N, zt_N1, _ = chunked_head(
            hidden_TH[mb.loss_pos_N],
            self.model.lm_head.weight,
            mb.target_ids_N[:, None],
            block_rows=self.loss_cfg.block_rows,
            block_vocab=self.loss_cfg.block_vocab,
            temperature=self.loss_cfg.temperature,
            with_entropy=False,
        )
        return zt_N1[:, 0] - lse_N

    def forward(self, mb: MicroBatch, logprobs_only: bool = False):
        """`(loss, stats)`, or with `logprobs_only` the target log-probs [N]. Everything goes through
        forward so ZeRO-3's hooks gather `lm_head.weight` (a method call would see an empty shard)."""
        cfg = self.loss_cfg
        hidden_TH = self.hidden_states(mb)
        if logprobs_only:
            return self._token_logprobs(hidden_TH, mb)
        h_NH = hidden_TH[mb.loss_pos_N]
        W_VH = self.model.lm_head.weight
        stats: dict[str, torch.Tensor] = {}
        if cfg.kind == "opd":
            assert mb.teacher_ids_NK is not None and mb.teacher_logp_NK is not None
            lse_N, zk_NK, ent_N = chunked_head(
                h_NH,
                W_VH,
                mb.teacher_ids_NK,
                block_rows=cfg.block_rows,
                block_vocab=cfg.block_vocab,
                temperature=cfg.temperature,
            )
            loss_N = opd_token_loss(
                lse_N, zk_NK, mb.teacher_logp_NK, ent_N, form=cfg.opd_form, entropy_coef=cfg.entropy_coef
            )
            sup = opd_support_stats(lse_N, zk_NK, mb.teacher_ids_NK, mb.teacher_logp_NK, mb.target_ids_N)
            stats.update({f"distill/{k}": v for k, v in sup.items()})
            stats["distill/entropy_sum"] = ent_N.detach().sum()
        else:
            lse_N, zt_N1, ent_N = chunked_head(
                h_NH,
                W_VH,
                mb.target_ids_N[:, None],
                block_rows=cfg.block_rows,
                block_vocab=cfg.block_vocab,
                temperature=cfg.temperature,
                with_entropy=cfg.log_entropy,
            )
            logp_N = zt_N1[:, 0] - lse_N
            if cfg.kind == "ppo":
                loss_N, clipped_N = ppo_token_loss(
                    logp_N,
                    mb.rollout_logp_N,
                    mb.advantage_N,
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    dual_clip=cfg.dual_clip,
                )
                low_N, high_N = ppo_clip_sides(
                    logp_N, mb.rollout_logp_N, mb.advantage_N, clip_low=cfg.clip_low, clip_high=cfg.clip_high
                )
                stats["train/clipped_sum"] = clipped_N.float().sum()
                stats["train/clipped_low_sum"] = low_N.float().sum()
                stats["train/clipped_high_sum"] = high_N.float().sum()
                stats["train/ratio_sum"] = (logp_N.detach() - mb.rollout_logp_N).exp().sum()
            else:
                loss_N = sft_token_loss(lse_N, zt_N1[:, 0])
            stats["train/entropy_sum"] = ent_N.detach().sum()
        # The weights already hold the whole step's denominators; loss_scale undoes DeepSpeed's
        # averaging of gradients over data-parallel ranks so the update equals sum_step(w * l).
        weighted = (loss_N * mb.weight_N.to(loss_N.dtype)).sum()
        if mb.loss_pos_N.numel() == 0:
            # a padding micro-batch still runs backward through every layer (ZeRO-3 collectives)
            weighted = weighted + 0.0 * hidden_TH.sum()
        stats["train/loss_weighted_sum"] = weighted.detach()
        stats["train/num_loss_tokens"] = torch.tensor(float(mb.loss_pos_N.numel()))
        stats["perf/num_real_tokens"] = torch.tensor(float(mb.num_real_tokens))
        stats["perf/num_row_tokens"] = torch.tensor(float(mb.input_ids_1T.shape[1]))
        return weighted * self.loss_scale, stats
