"""Trainer configs: optimizer and DeepSpeed (TrainerConfig), the loss (LossConfig), packing
(PackingConfig). Kept apart from the torch code so config schemas import no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

OPD_FORMS = ("report", "tail")
MASK_MODES = ("segments", "block_causal", "position_ids")
SEQUENCE_UNITS = ("segment", "chunk")


@dataclass
class LossConfig:
    kind: str = "opd"  # "opd" (stage 1), "ppo" (stage 2) or "sft" (cross-entropy on response tokens)
    opd_form: str = "report"  # "report": KL over the teacher top-k only; "tail": adds the (k+1)-th bucket
    entropy_coef: float = 0.005  # OPD entropy bonus coefficient (report: 0.005)
    clip_low: float = 0.2  # PPO ratio lower clip: 1 - clip_low
    clip_high: float = 0.2  # PPO ratio upper clip: 1 + clip_high
    dual_clip: float | None = None  # dual-clip constant c > 1 for negative advantages; None = off
    ratio_source: str = (
        "rollout"  # "rollout": engine logprobs; "recompute": old policy forward before the update
    )
    temperature: float = 1.0  # logits divided by it; 1 matches the engines' raw logprobs (engines/base.py)
    block_rows: int = 4096  # chunked LM head tile: loss positions per row block
    block_vocab: int = 2048  # chunked LM head tile: vocab entries per block
    log_entropy: bool = False  # PPO/SFT: also compute the entropy (logging only, ~15% more loss-head time)
    # PPO "sequence" of the seq-mean-token-mean: "segment" (one LLM call) or "chunk" (all calls of one
    # chunk of one rollout: one vote of loss mass per chunk, as its advantage A[i, t] has one vote)
    sequence_unit: str = "segment"

    def validate(self) -> None:
        if self.kind not in ("opd", "ppo", "sft"):
            raise ValueError(f"trainer.loss.kind={self.kind!r}: want 'opd', 'ppo' or 'sft'")
        if self.opd_form not in OPD_FORMS:
            raise ValueError(f"trainer.loss.opd_form={self.opd_form!r}: want one of {OPD_FORMS}")
        if self.ratio_source not in ("rollout", "recompute"):
            raise ValueError(
                f"trainer.loss.ratio_source={self.ratio_source!r}: want 'rollout' or 'recompute'"
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"trainer.loss.dual_clip={self.dual_clip}: must be > 1 (or null)")
        if self.block_rows < 1 or self.block_vocab < 1:
            raise ValueError("trainer.loss.block_rows / trainer.loss.block_vocab must be >= 1")
        if self.sequence_unit not in SEQUENCE_UNITS:
            raise ValueError(
                f"trainer.loss.sequence_unit={self.sequence_unit!r}: want one of {SEQUENCE_UNITS}"
            )


@dataclass
class PackingConfig:
    num_tokens_per_micro_batch: int = 4096  # capacity of one packed row (prompt + response tokens)
    pad_to_multiple: int = 8  # row length rounded up to this (kernel-friendly shapes)
    mask: str = (
        "segments"  # "segments" (per-segment sdpa), "block_causal" (dense mask), "position_ids" (flash)
    )
    max_segments_per_micro_batch: int = 0  # cap on segments per row (0 = no cap)

    def validate(self) -> None:
        if self.num_tokens_per_micro_batch < 2:
            raise ValueError("trainer.packing.num_tokens_per_micro_batch must be >= 2")
        if self.pad_to_multiple < 1:
            raise ValueError("trainer.packing.pad_to_multiple must be >= 1")
        if self.mask not in MASK_MODES:
            raise ValueError(f"trainer.packing.mask={self.mask!r}: want one of {MASK_MODES}")


@dataclass
class TrainerConfig:
    lr: float  # constant learning rate (report: 1e-6 OPD, 5e-6 RL)
    weight_decay: float = 0.0  # AdamW weight decay
    adam_beta1: float = 0.9  # AdamW beta1
    adam_beta2: float = 0.999  # AdamW beta2
    adam_eps: float = 1e-8  # AdamW epsilon
    max_grad_norm: float = 1.0  # global gradient-norm clip (0 = off)
    zero_stage: int = 3  # DeepSpeed ZeRO stage (3 in the report's setup)
    zero_persistence_threshold: int = 100_000  # ZeRO-3: params with fewer elements stay whole (tests: 0)
    # ZeRO-3: build a checkpoint's model inside deepspeed.zero.Init, so no rank ever holds a full copy
    # (trainer/engine.py load_trainer_model); off: every rank loads it whole, then DeepSpeed partitions
    zero_init: bool = True
    precision: str = "auto"  # "auto" (bf16 on GPU, fp32 on CPU), "bf16" or "fp32"
    gradient_checkpointing: bool = True  # recompute decoder layers in backward
    routing_replay: bool = True  # force the rollout engine's experts in the training forward
    seed: int = 0  # seeds torch / numpy / python RNGs on every rank (and the mini-batch shuffle)
    # PPO updates per rollout batch: num_ppo_epochs passes over the batch, each split into
    # num_mini_batches optimizer steps (1/1: one step per batch, the ratio only measures the
    # train/inference mismatch; more: later updates see the policy move, ratio != 1, the clip engages)
    num_ppo_epochs: int = 1
    num_mini_batches: int = 1
    loss: LossConfig = field(default_factory=LossConfig)  # which loss and its knobs
    packing: PackingConfig = field(default_factory=PackingConfig)  # micro-batch packing

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"trainer.lr={self.lr}: must be > 0")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"trainer.zero_stage={self.zero_stage}: want 0-3")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"trainer.precision={self.precision!r}: want 'auto', 'bf16' or 'fp32'")
        if self.num_ppo_epochs < 1 or self.num_mini_batches < 1:
            raise ValueError(
                f"trainer.num_ppo_epochs={self.num_ppo_epochs}, trainer.num_mini_batches="
                f"{self.num_mini_batches}: both must be >= 1"
            )
        if self.loss.kind != "ppo" and self.num_ppo_epochs * self.num_mini_batches > 1:
            raise ValueError(
                f"trainer.num_ppo_epochs / trainer.num_mini_batches > 1 need trainer.loss.kind='ppo' "
                f"(got {self.loss.kind!r}: one optimizer step per batch)"
            )
        self.loss.validate()
        self.packing.validate()
