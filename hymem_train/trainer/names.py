"""Tensor names: transformers' in-memory HYV3 (fused experts) -> the on-disk layout vLLM's HYV3 loader
reads (per-expert), shared by the export (trainer/export.py) and the weight sync to vLLM replicas
(trainer/weight_sync.py)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

# kept in float32 whatever `dtype` says: HF's HYV3 keeps them fp32 (`_keep_in_fp32_modules_strict`) and
# vLLM builds the router gate and expert bias as fp32 parameters
FP32_SUFFIXES = (".mlp.gate.weight", ".mlp.expert_bias")


def serving_tensors(name: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """One transformers HYV3 parameter/buffer as the on-disk tensors vLLM's HYV3 loader accepts (views)."""
    if name.endswith(".mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows then up rows (HYV3Experts.forward)
        base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
        for e in range(t.shape[0]):
            yield f"{base}{e}.gate_proj.weight", t[e, :inter]
            yield f"{base}{e}.up_proj.weight", t[e, inter:]
    elif name.endswith(".mlp.experts.down_proj"):  # [E, H, I]
        base = name[: -len("down_proj")]
        for e in range(t.shape[0]):
            yield f"{base}{e}.down_proj.weight", t[e]
    elif name.endswith(".mlp.e_score_correction_bias"):
        yield name[: -len("e_score_correction_bias")] + "expert_bias", t
    elif ".mlp.shared_experts." in name:
        yield name.replace(".mlp.shared_experts.", ".mlp.shared_mlp."), t
    else:
        yield name, t


def out_dtype(out_name: str, t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if not t.is_floating_point():
        return t.dtype
    if out_name.endswith(FP32_SUFFIXES):
        return torch.float32
    return dtype or t.dtype


def persistent_buffers(model) -> dict:
    """The model's persistent buffers (HYV3's router `e_score_correction_bias`), which ZeRO-3 does not
    partition: without them the export loads with MISSING keys, silently re-initialised to zeros."""
    out = {}
    for mod_name, mod in model.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                out[f"{mod_name}.{name}" if mod_name else name] = buf.detach().cpu().clone()
    return out
