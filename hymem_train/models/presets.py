"""HYV3 presets built from config with the native transformers classes (DESIGN.md section 1).

`hy_memory_30b_a3b` carries the report's numbers. The report does not say whether layer 0 is dense
(transformers' HYV3 default) so we follow its wording, "48 layers, 128 routed experts + 1 shared":
every layer is an MoE layer. That gives ~30.6B total / ~3.5B active (3.2B without the embedding
table), the "30B-A3B" of the name; `count_params` computes it analytically and a test checks it
against a meta-device instantiation.

Tiny presets keep every layer sparse too, so routing capture/replay is exercised in every layer.
Their vocab matches the shipped tokenizer (hymem_train/assets/tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import HYV3Config, HYV3ForCausalLM

# = the shipped tokenizer's size (hymem_train/assets/tokenizer: BPE capped at 896, a multiple of 64).
TINY_VOCAB = 896

# The demo models must learn to copy (a name and a value from the chunk into a fact, a value from a
# record into an answer) within a few hundred CPU steps. HYV3 normalises q and k per head (QK-norm),
# so an attention logit is at most sqrt(head_dim) * |q_norm| * |k_norm|: head_dim 64 raises the cap
# from ~5.7 to 8 (the report's 128: 11). The report's rope_theta (~1.1e7, for 256k contexts) leaves a
# 1k-token model almost no positional signal; 1e4 is the usual short-context value. initializer_range
# 0.02: HYV3's 0.006 is scaled for hidden 2048. Measured effects: docs/findings.md, "Models".
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


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter
    active: int  # parameters touched per token (top-k routed + shared experts), embeddings included
    active_non_embedding: int  # active minus the input embedding table (a lookup, no FLOPs)


def make_config(name: str, **overrides: Any) -> HYV3Config:
    """A HYV3Config from a preset name plus overrides (e.g. attn_implementation, num_hidden_layers)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    kw = dict(PRESETS[name])
    kw.update(overrides)
    n_layers = kw["num_hidden_layers"]
    if len(kw.get("mlp_layer_types") or []) != n_layers:
        kw["mlp_layer_types"] = ["sparse"] * n_layers
    attn = kw.pop("attn_implementation", "sdpa")
    cfg = HYV3Config(**kw)
    cfg._attn_implementation = attn
    return cfg


def build_model(
    config: HYV3Config | str, seed: int = 0, dtype: torch.dtype = torch.float32
) -> HYV3ForCausalLM:
    """A randomly initialised HYV3ForCausalLM; deterministic in `seed`."""
    if isinstance(config, str):
        config = make_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = HYV3ForCausalLM(config)
    return model.to(dtype=dtype)


def count_params(config: HYV3Config) -> ParamCounts:
    """Analytic total / active parameter counts of an HYV3 config (no allocation)."""
    h, v = config.hidden_size, config.vocab_size
    hd = config.head_dim
    attn = h * config.num_attention_heads * hd * 2 + h * config.num_key_value_heads * hd * 2 + 2 * hd
    norms = 2 * h
    expert = 3 * h * config.moe_intermediate_size
    total = active = 0
    for kind in config.mlp_layer_types:
        if kind == "sparse":
            router = config.num_experts * h
            shared = 3 * h * config.moe_intermediate_size * config.num_shared_experts
            total += attn + norms + router + shared + config.num_experts * expert
            active += attn + norms + router + shared + config.num_experts_per_tok * expert
        else:
            mlp = 3 * h * config.intermediate_size
            total += attn + norms + mlp
            active += attn + norms + mlp
    embed = v * h
    head = 0 if config.tie_word_embeddings else v * h
    total += embed + head + h
    active += embed + head + h
    return ParamCounts(total=total, active=active, active_non_embedding=active - embed)


def count_params_meta(config: HYV3Config) -> int:
    """Parameter count of a real instantiation on the meta device (no memory): checks count_params."""
    with torch.device("meta"):
        model = HYV3ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())
