import pytest
import torch

from hymem_train.models.presets import (
    PRESETS,
    TINY_VOCAB,
    build_model,
    count_params,
    count_params_meta,
    make_config,
)
from hymem_train.models.tokenizer import default_tokenizer


def test_30b_preset_has_report_numbers():
    c = make_config("hy_memory_30b_a3b")
    assert (c.num_hidden_layers, c.hidden_size) == (48, 2048)
    assert (c.num_experts, c.num_experts_per_tok, c.num_shared_experts) == (128, 8, 1)
    assert c.moe_intermediate_size == 768
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 4, 128)
    assert c.vocab_size == 120_832 and c.max_position_embeddings == 262_144
    assert c.model_type == "hy_v3"


def test_30b_is_30b_total_3b_active_without_allocation():
    c = make_config("hy_memory_30b_a3b")
    counts = count_params(c)
    assert 29.5e9 < counts.total < 31.5e9, counts
    assert 2.8e9 < counts.active < 3.8e9, counts
    assert 2.8e9 < counts.active_non_embedding < 3.5e9, counts
    # the analytic count is exactly what the real class instantiates (meta device: no memory)
    assert count_params_meta(c) == counts.total


def test_bench_1b_active_is_1b_active_without_allocation():
    c = make_config("bench_1b_active")
    counts = count_params(c)
    assert 0.9e9 < counts.active_non_embedding < 1.1e9, counts  # what the benchmark's FLOP count uses
    assert count_params_meta(c) == counts.total


LARGE = ("hy_memory_30b_a3b", "bench_1b_active")  # meta device only here (4.4B+ parameters)


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in LARGE])
def test_tiny_presets_build_and_count(name):
    c = make_config(name)
    m = build_model(c, seed=1)
    assert sum(p.numel() for p in m.parameters()) == count_params(c).total
    assert all(t == "sparse" for t in c.mlp_layer_types)


def test_build_model_deterministic_in_seed():
    a, b, c = build_model("tiny", seed=3), build_model("tiny", seed=3), build_model("tiny", seed=4)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


def test_unknown_preset_names_known_ones():
    with pytest.raises(KeyError, match="tiny_student"):
        make_config("nope")


def test_tokenizer_fits_tiny_vocab():
    assert len(default_tokenizer()) <= TINY_VOCAB


@pytest.mark.parametrize("name", ["tiny_teacher", "tiny_student"])
def test_demo_presets_can_attend_sharply_enough_to_copy(name):
    # QK-norm caps an attention logit at sqrt(head_dim) * gains: at head_dim 32 (cap ~5.7) the demo
    # teacher never learned to copy from the chunk; the report's 1.1e7 rope_theta leaves a 1k-token
    # model almost no positional signal (preset_table._TINY_DEMO_ATTENTION has the measurements)
    c = make_config(name)
    assert c.head_dim**0.5 >= 8
    assert c.rope_parameters["rope_theta"] == 10_000.0 and c.initializer_range == 0.02
    assert make_config("hy_memory_30b_a3b").rope_parameters["rope_theta"] > 1e6  # the report's stays
