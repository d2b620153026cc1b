"""The HF export (hymem_train/trainer/export.py, python -m hymem_train.export) and step-checkpoint loading.

Fast: on-disk names against vLLM's HYV3 loader, config keys, the writer's and the loader's guards.
Slow: train 2 steps under torchrun (1 rank and 2 ranks, ZeRO-3), export the step checkpoint through the
CLI, load with AutoModelForCausalLM / AutoTokenizer and compare logits with the trained weights'.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hymem_train.config import ConfigError, compose, to_typed
from hymem_train.models.checkpoint_files import CheckpointPathError
from hymem_train.models.config import ModelConfig
from hymem_train.run_config import ExportConfig
from tests.trainer.test_engine_dist import run_worker

ROOT = Path(__file__).resolve().parents[2]

# The checkpoint names vLLM's HYV3 loader accepts, read from vllm-project/vllm
# vllm/model_executor/models/hy_v3.py at commit 055e47c28003156421365af985d676fc921cb075
# (HYV3Model.load_weights: stacked q/k/v -> qkv_proj and gate/up -> gate_up_proj, per-expert
# experts.{e}.{gate,up,down}_proj via fused_moe_make_expert_params_mapping, `router.gate.` -> `gate.`,
# everything else by its own name in named_parameters()). Untied embeddings, no quantisation, no MTP layers.
VLLM_NAME_PATTERNS = {
    "embed": r"model\.embed_tokens\.weight",
    "final_norm": r"model\.norm\.weight",
    "lm_head": r"lm_head\.weight",
    "layer_norms": r"model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight",
    "attn_proj": r"model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.weight",
    "qk_norm": r"model\.layers\.(\d+)\.self_attn\.(q_norm|k_norm)\.weight",  # only built when config.qk_norm
    "dense_mlp": r"model\.layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.weight",  # layer < first_k_dense_replace
    "router": r"model\.layers\.(\d+)\.mlp\.(router\.)?gate\.weight",
    "expert_bias": r"model\.layers\.(\d+)\.mlp\.expert_bias",
    "shared": r"model\.layers\.(\d+)\.mlp\.shared_mlp\.(gate_proj|up_proj|down_proj)\.weight",
    "experts": r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight",
}


def vllm_expected_names(cfg: dict) -> set[str]:
    """Every tensor vLLM's HYV3ForCausalLM loads for this config.json (the names it would miss otherwise)."""
    out = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        out |= {
            f"{p}self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
        }
        if layer < cfg["first_k_dense_replace"]:
            out |= {f"{p}mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")}
            continue
        out |= {p + "mlp.gate.weight", p + "mlp.expert_bias"}
        out |= {f"{p}mlp.shared_mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")}
        out |= {
            f"{p}mlp.experts.{e}.{n}.weight"
            for e in range(cfg["num_experts"])
            for n in ("gate_proj", "up_proj", "down_proj")
        }
    return out


def saved_tensors(d: Path) -> dict[str, tuple[list[int], str]]:
    from safetensors import safe_open

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(f, "pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open is not iterable)
                sl = fh.get_slice(k)
                out[k] = (sl.get_shape(), sl.get_dtype())
    return out


def _tiny(seed: int = 0):
    from hymem_train.models.presets import build_model, make_config

    torch.set_num_threads(1)
    return build_model(make_config("tiny", attn_implementation="eager"), seed=seed)


def _export_plain(model, out: Path, dtype=None, max_shard_bytes=5 * 10**9):
    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.trainer.export import CardInfo, _live_tensors, write_hf_dir

    write_hf_dir(
        _live_tensors(model, 1 << 16),
        model.config,
        out,
        dtype=dtype,
        tokenizer=default_tokenizer(),
        card=CardInfo(stage="t", step=0),
        max_shard_bytes=max_shard_bytes,
    )


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_exported_names_are_exactly_what_vllm_loads(tmp_path):
    model = _tiny()
    model.model.layers[0].mlp.e_score_correction_bias.fill_(0.25)  # a buffer with a value to carry
    _export_plain(model, tmp_path / "out", dtype=torch.bfloat16, max_shard_bytes=200_000)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    # every key vLLM's HYV3 model reads is written (docs/export.md)
    assert (cfg["first_k_dense_replace"], cfg["qk_norm"], cfg["route_norm"]) == (0, True, True)
    assert cfg["expert_hidden_dim"] == cfg["moe_intermediate_size"] == 32
    assert cfg["architectures"] == ["HYV3ForCausalLM"] and cfg["dtype"] == "bfloat16"
    saved = saved_tensors(tmp_path / "out")
    for name in saved:
        assert any(re.fullmatch(p, name) for p in VLLM_NAME_PATTERNS.values()), name
    assert set(saved) == vllm_expected_names(cfg)
    assert len(list((tmp_path / "out").glob("model-*-of-*.safetensors"))) > 1  # sharded, with an index
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(saved)
    # dtype honoured; router gate and expert bias stay fp32 as HF's HYV3 keeps them
    assert saved["model.layers.0.mlp.experts.3.up_proj.weight"] == ([32, 64], "BF16")
    assert saved["model.layers.0.mlp.gate.weight"][1] == saved["model.layers.0.mlp.expert_bias"][1] == "F32"
    from transformers import AutoModelForCausalLM

    m, info = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", local_files_only=True, output_loading_info=True
    )
    assert not any(info.values()), info
    assert torch.equal(m.model.layers[0].mlp.e_score_correction_bias, torch.full((8,), 0.25))
    # the fused expert tensor is rebuilt exactly (gate rows then up rows)
    want = model.model.layers[1].mlp.experts.gate_up_proj.detach().to(torch.bfloat16)
    assert torch.equal(m.model.layers[1].mlp.experts.gate_up_proj.to(torch.bfloat16), want)


def test_fp32_export_of_a_plain_model_has_bit_exact_logits(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _tiny(seed=3)
    _export_plain(model, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").exists()  # one shard: no index (HF convention)
    tok = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    ids = torch.tensor([tok.encode("Alice moved to Paris in 2021; her dog is called Rex.")])
    m = AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", local_files_only=True, attn_implementation="eager"
    )
    assert torch.equal(_logits(m, ids), _logits(model, ids))
    gen = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "vllm serve DIR --served-model-name hy-memory" in card


def test_writer_refuses_a_tensor_the_plan_does_not_expect(tmp_path):
    from hymem_train.trainer.export import ShardedSafetensorsWriter

    w = ShardedSafetensorsWriter(tmp_path, [("a", (2,), torch.float32), ("b", (3,), torch.float32)], 1 << 20)
    w.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match=r"tensor #1 is 'b' \(4,\).*expects 'b' \(3,\)"):
        w.write("b", torch.zeros(4))
    with pytest.raises(ValueError, match="1 planned tensors never arrived"):
        w.close()


def test_interleaved_dense_layers_cannot_be_served_by_vllm():
    from hymem_train.models.presets import make_config
    from hymem_train.trainer.export import serving_config

    cfg = make_config("tiny", num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"])
    with pytest.raises(ValueError, match="dense layers first then sparse"):
        serving_config(cfg, None)
    cfg = make_config("tiny", num_hidden_layers=3, mlp_layer_types=["dense", "sparse", "sparse"])
    assert serving_config(cfg, None).first_k_dense_replace == 1


def test_load_model_names_a_path_that_is_no_checkpoint(tmp_path):
    from hymem_train.models.loading import load_model

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointPathError, match="not a checkpoint. Expected an HF directory"):
        load_model(ModelConfig(path=str(tmp_path)))


def test_export_config_validates_push_to_hub_and_dtype():
    base = ["checkpoint=/c", "out_dir=/o"]
    assert (
        to_typed(compose("export", [*base, "push_to_hub=me/hy-memory"]), ExportConfig).push_to_hub
        == "me/hy-memory"
    )
    with pytest.raises(ValueError, match="push_to_hub='hy-memory': want a Hub repo id"):
        to_typed(compose("export", [*base, "push_to_hub=hy-memory"]), ExportConfig)
    with pytest.raises(ValueError, match="dtype 'int8'"):
        to_typed(compose("export", [*base, "dtype=int8"]), ExportConfig)
    with pytest.raises(ConfigError, match="checkpoint, out_dir"):
        to_typed(compose("export"), ExportConfig)


# ---- slow: real step checkpoints from torchrun ------------------------------------------------------------
def _export_cli(ckpt: Path, out: Path, *over: str) -> None:
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "hymem_train.export", f"checkpoint={ckpt}", f"out_dir={out}", *over]
    res = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


def _trained(params: dict[str, torch.Tensor]):
    model = _tiny()
    missing, unexpected = model.load_state_dict(params, strict=False)
    assert not unexpected and all("e_score_correction_bias" in k for k in missing)
    return model


def _round_trip(tmp_path: Path, nproc: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    common = ["--lr", "1e-3", "--adam-eps", "1e-8", "--capacity", "40", "--steps", "2"]
    _, params = run_worker(nproc, tmp_path / "w", *common, "--save-dir", str(run / "checkpoints"))
    # the run directory a stage leaves: its config (the architecture) and held-out metrics for the card
    (run / "config.yaml").write_text("run:\n  name: opd_test\nmodel:\n  preset: tiny\ninit_checkpoint: ''\n")
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "eval/reverse_kl": 0.5})
        + "\n"
        + json.dumps({"step": 2, "eval/reverse_kl": 0.25})
        + "\n"
    )
    trained = _trained(params)
    ids = torch.tensor([list(range(5, 69)), list(range(300, 364))])
    ref = _logits(trained, ids)
    out = {}
    for dtype in ("float32", "bfloat16"):
        d = tmp_path / f"hf_{dtype}"
        _export_cli(run / "checkpoints" / "step_2", d, f"dtype={dtype}")
        m = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, attn_implementation="eager")
        tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
        assert tok.decode(tok.encode("bank write")) == "bank write"
        got = _logits(m, ids)
        if dtype == "float32":
            assert torch.equal(got, ref), (got - ref).abs().max()
        else:
            out["bf16_max_abs"] = (got - ref).abs().max().item()
            out["ref_max_abs"] = ref.abs().max().item()
            # bf16 weights (8-bit mantissa) and bf16 activations: stated tolerance docs/export.md
            assert out["bf16_max_abs"] < 0.05 * out["ref_max_abs"], out
        assert set(saved_tensors(d)) == vllm_expected_names(json.loads((d / "config.json").read_text()))
    card = (tmp_path / "hf_bfloat16" / "README.md").read_text()
    assert "training stage: `opd_test`" in card and "- step: 2" in card
    assert "| `eval/reverse_kl` | 0.25 |" in card and "preset: tiny" in card
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_round_trip_one_rank_zero3(tmp_path):
    print(_round_trip(tmp_path, 1))


@pytest.mark.slow
@pytest.mark.distributed
def test_round_trip_two_rank_zero3(tmp_path):
    print(_round_trip(tmp_path, 2))


@pytest.mark.slow
@pytest.mark.distributed
def test_load_model_from_a_step_checkpoint_and_the_latest_pointer(tmp_path):
    from hymem_train.models.loading import load_model

    run = tmp_path / "run"
    _, params = run_worker(
        2,
        tmp_path / "w",
        "--lr",
        "1e-3",
        "--adam-eps",
        "1e-8",
        "--capacity",
        "40",
        "--steps",
        "2",
        "--save-dir",
        str(run / "checkpoints"),
    )
    (run / "config.yaml").write_text("model:\n  preset: tiny\n")
    for path in (run / "checkpoints" / "step_2", run / "checkpoints"):
        m = load_model(ModelConfig(path=str(path), attn_implementation="eager"))
        sd = m.state_dict()
        assert all(torch.equal(sd[k], v) for k, v in params.items())


def test_a_vllm_stage_exports_an_init_checkpoint_without_vllms_keys(tmp_path):
    """A plain save_pretrained directory lacks the HYV3 keys vLLM reads (silent failure wrong-logits-after-sync): a stage with
    engine.kind=vllm serves an export of it (<run>/init_hf) that passes the engine's check."""
    from hymem_train.engines.serving import engine_model_cfg
    from hymem_train.engines.vllm_engine import check_serving_config
    from hymem_train.models.tokenizer import default_tokenizer

    raw = tmp_path / "raw"
    _tiny(seed=4).save_pretrained(raw)
    default_tokenizer().save_pretrained(raw)
    with pytest.raises(ValueError, match="lacks"):
        check_serving_config(raw)
    served = engine_model_cfg(
        "vllm", ModelConfig(preset="tiny", path=str(raw), dtype="float32"), tmp_path / "a"
    )
    assert served.path == str(tmp_path / "a")
    check_serving_config(served.path)  # every key written, with transformers' values
    assert (
        engine_model_cfg("vllm", served, tmp_path / "b").path == served.path
    )  # an export is served as it is
    # a model without a checkpoint (a run from the preset's initial weights): an export of them
    fresh = engine_model_cfg("vllm", ModelConfig(preset="tiny", seed=4), tmp_path / "c")
    check_serving_config(fresh.path)
    assert engine_model_cfg("hf", ModelConfig(preset="tiny", path=str(raw)), tmp_path / "d").path == str(raw)
