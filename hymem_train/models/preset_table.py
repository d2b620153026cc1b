"""The HYV3 preset table: plain numbers, no torch or transformers, so that config validation and the
launch check can name presets cheaply. presets.py builds configs and models from it."""

from __future__ import annotations

from typing import Any

# = the shipped tokenizer's size (hymem_train/assets/tokenizer: BPE capped at 896, a multiple of 64).
TINY_VOCAB = 896

# The demo models must learn to copy (a name and a value from the chunk into a fact, a value from a
# record into an answer) within a few hundred CPU steps. HYV3 normalises q and k per head (QK-norm),
# so an attention logit is at most sqrt(head_dim) * |q_norm| * |k_norm|: head_dim 64 raises the cap
# from ~5.7 to 8 (the report's 128: 11). The report's rope_theta (~1.1e7, for 256k contexts) leaves a
# 1k-token model almost no positional signal; 1e4 is the usual short-context value. initializer_range
# 0.02: HYV3's 0.006 is scaled for hidden 2048. Measured effects: docs/log/findings.md, "Models".
_TINY_DEMO_ATTENTION: dict[str, Any] = dict(
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    initializer_range=0.02,
)

PRESETS: dict[str, dict[str, Any]] = {
    # The report's model (Hy-Memory-30B-A3B): never allocated on CPU; meta device only.
    "hy_memory_30b_a3b": dict(
        num_hidden_layers=48,
        hidden_size=2048,
        num_experts=128,
        num_experts_per_tok=8,
        num_shared_experts=1,
        moe_intermediate_size=768,
        intermediate_size=6144,  # dense-MLP width; unused when every layer is sparse
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=120_832,
        max_position_embeddings=262_144,
        mlp_layer_types=["sparse"] * 48,
    ),
    # Training-step benchmark on one GPU (benchmarks/bench_train_step.py --gpu, scripts/device_check.sh):
    # the report's layer shape (hidden 2048, 32 q / 4 kv heads of 128, experts of 768, top-8 + 1
    # shared, vocab 120,832) at 12 layers and 64 experts, so ~1B parameters are active per token.
    # count_params: total 4.40B, active 1.23B, active non-embedding 0.99B (what the FLOP count uses).
    "bench_1b_active": dict(
        num_hidden_layers=12,
        hidden_size=2048,
        num_experts=64,
        num_experts_per_tok=8,
        num_shared_experts=1,
        moe_intermediate_size=768,
        intermediate_size=6144,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=120_832,
        max_position_embeddings=262_144,
        mlp_layer_types=["sparse"] * 12,
    ),
    # Demo teacher: the SFT'd model OPD distils from.
    "tiny_teacher": dict(
        num_hidden_layers=4,
        hidden_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        num_shared_experts=1,
        moe_intermediate_size=64,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,  # see _TINY_DEMO_ATTENTION
        vocab_size=TINY_VOCAB,
        max_position_embeddings=4096,
        mlp_layer_types=["sparse"] * 4,
        **_TINY_DEMO_ATTENTION,
    ),
    # Demo student: smaller than the teacher (3 layers, hidden 96 vs 4 layers, hidden 128).
    "tiny_student": dict(
        num_hidden_layers=3,
        hidden_size=96,
        num_experts=8,
        num_experts_per_tok=2,
        num_shared_experts=1,
        moe_intermediate_size=48,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,  # see _TINY_DEMO_ATTENTION
        vocab_size=TINY_VOCAB,
        max_position_embeddings=4096,
        mlp_layer_types=["sparse"] * 3,
        **_TINY_DEMO_ATTENTION,
    ),
    # Unit tests: the smallest useful HYV3 (2 layers, hidden 64).
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_shared_experts=1,
        moe_intermediate_size=32,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=TINY_VOCAB,
        max_position_embeddings=4096,
        mlp_layer_types=["sparse"] * 2,
    ),
}
