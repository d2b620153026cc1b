"""The policy as a Hugging Face directory that HF `from_pretrained` and vLLM's HYV3 loader both read.

One implementation for both callers: the end of every training stage (`export_hf`: `<run>/final`, the
next stage's `init_checkpoint`) and `python -m hymem_train.export` (`export_checkpoint`: any step
checkpoint or HF directory). Weights arrive one parameter (or a bounded bucket) at a time and are
streamed into safetensors shards whose headers are planned up front from the parameter shapes, so the
writer never holds more than one bucket; under ZeRO-3 every rank gathers and only rank 0 writes.

On-disk names are the HYV3 checkpoint layout vLLM's loader accepts (docs/export.md lists them, with
the vLLM commit read): per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` (transformers fuses
them into `gate_up_proj` / `down_proj` on load), `mlp.shared_mlp.*`, `mlp.expert_bias`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import shutil
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hymem_train.models.checkpoint_files import (
    DeepSpeedWeights,
    checkpoint_kind,
    hf_config_for,
    run_dir_of,
    run_model_source,
    step_dir_of,
    step_of,
)
from hymem_train.models.config import ModelConfig
from hymem_train.models.loading import DTYPES, load_tokenizer_for
from hymem_train.trainer.names import out_dtype, persistent_buffers, serving_tensors
from hymem_train.trainer.weight_sync import iter_full_param_buckets

log = logging.getLogger(__name__)

SERVED_MODEL_NAME = "hy-memory"
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def skeleton_entries(hf_config) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every tensor an HYV3ForCausalLM of `hf_config` saves, in the order the
    exporters produce them: `named_parameters()` then persistent buffers (a meta-device model)."""
    from transformers import HYV3ForCausalLM

    with torch.device("meta"):
        m = HYV3ForCausalLM(hf_config)
    out = [(n, tuple(p.shape), p.dtype) for n, p in m.named_parameters()]
    for mod_name, mod in m.named_modules():
        for n, b in mod._buffers.items():
            if b is not None and n not in mod._non_persistent_buffers_set:
                out.append((f"{mod_name}.{n}", tuple(b.shape), b.dtype))
    if hf_config.tie_word_embeddings:
        out = [e for e in out if e[0] != "lm_head.weight"]
    return out


# ---- the streaming safetensors writer ------------------------------------------------------------------
@dataclass
class _Shard:
    file: str
    entries: list[tuple[str, tuple[int, ...], torch.dtype]] = field(default_factory=list)
    nbytes: int = 0


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


class ShardedSafetensorsWriter:
    """Writes a planned list of tensors into `model-XXXXX-of-YYYYY.safetensors` + the index (or one
    `model.safetensors` when everything fits one shard).

    Each shard's header (names, dtypes, shapes, offsets) is known from the plan, so it is written first
    and each tensor's bytes are appended as it arrives: nothing is buffered. Tensors must arrive in plan
    order with the planned shape and dtype (an error names the first that does not).
    """

    def __init__(
        self, out_dir: Path, plan: list[tuple[str, tuple[int, ...], torch.dtype]], max_shard_bytes: int
    ):
        self.out_dir = out_dir
        shards: list[_Shard] = [_Shard("")]
        for name, shape, dtype in plan:
            nb = _nbytes(shape, dtype)
            if shards[-1].entries and shards[-1].nbytes + nb > max_shard_bytes:
                shards.append(_Shard(""))
            shards[-1].entries.append((name, shape, dtype))
            shards[-1].nbytes += nb
        for i, s in enumerate(shards):  # one shard: plain `model.safetensors`, no index (the HF convention)
            s.file = (
                f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                if len(shards) > 1
                else "model.safetensors"
            )
        self.shards = shards
        self._queue = [(si, e) for si, s in enumerate(shards) for e in s.entries]
        self._pos = 0
        self._fh = None
        self._open_shard = -1
        self.total_bytes = sum(s.nbytes for s in shards)

    def _open(self, si: int) -> None:
        if self._fh is not None:
            self._fh.close()
        shard = self.shards[si]
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        off = 0
        for name, shape, dtype in shard.entries:
            nb = _nbytes(shape, dtype)
            header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
        self._fh = open(self.out_dir / shard.file, "wb")  # noqa: SIM115 (closed in _open / close)
        self._fh.write(struct.pack("<Q", len(raw)) + raw)
        self._open_shard = si

    def write(self, name: str, t: torch.Tensor) -> None:
        if self._pos >= len(self._queue):
            raise ValueError(f"export: unexpected tensor {name!r} after the planned {len(self._queue)}")
        si, (pname, shape, dtype) = self._queue[self._pos]
        if (name, tuple(t.shape), t.dtype) != (pname, shape, dtype):
            raise ValueError(
                f"export: tensor #{self._pos} is {name!r} {tuple(t.shape)} {t.dtype}; the plan (built from "
                f"the model config) expects {pname!r} {shape} {dtype}: checkpoint and config disagree"
            )
        if si != self._open_shard:
            self._open(si)
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        self._fh.write(memoryview(flat.numpy()))
        self._pos += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._pos != len(self._queue):
            raise ValueError(
                f"export: {len(self._queue) - self._pos} planned tensors never arrived "
                f"(first: {self._queue[self._pos][1][0]!r})"
            )
        if len(self.shards) == 1:
            return
        index = {
            "metadata": {"total_size": self.total_bytes},
            "weight_map": {n: s.file for s in self.shards for n, _, _ in s.entries},
        }
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ---- config, generation config, card ---------------------------------------------------------------------
def serving_config(hf_config, dtype: torch.dtype | None):
    """A copy of the HYV3Config with every key vLLM's HYV3 model reads written explicitly (docs/export.md)."""
    cfg = copy.deepcopy(hf_config)
    kinds = list(cfg.mlp_layer_types)
    k = kinds.index("sparse") if "sparse" in kinds else len(kinds)
    if kinds != ["dense"] * k + ["sparse"] * (len(kinds) - k):
        raise ValueError(
            f"mlp_layer_types={kinds}: vLLM's HYV3 expresses only dense layers first then sparse "
            "(first_k_dense_replace); this model cannot be served by it"
        )
    cfg.first_k_dense_replace = k  # missing: vLLM refuses to build the model
    cfg.qk_norm = True  # transformers' HYV3Attention always applies q_norm/k_norm; missing: vLLM drops them
    cfg.expert_hidden_dim = cfg.moe_intermediate_size  # vLLM's per-expert (and shared-expert unit) width
    cfg.route_norm = True  # transformers' HYV3TopKRouter divides the top-k weights by their sum
    cfg.moe_router_use_sigmoid = True  # HYV3TopKRouter: sigmoid scores
    cfg.moe_router_enable_expert_bias = True  # e_score_correction_bias, saved as mlp.expert_bias
    cfg.use_cache = True  # the trainer turns it off
    cfg.architectures = ["HYV3ForCausalLM"]
    if dtype is not None:
        cfg.dtype = dtype
    return cfg


@dataclass
class CardInfo:
    stage: str = ""  # run name of the stage that trained it
    step: int | None = None
    source: str = ""  # what was exported
    run_config_yaml: str = ""  # the run's config.yaml, verbatim
    metrics: dict[str, float] = field(default_factory=dict)  # last held-out values (eval/*)
    metrics_step: int | None = None
    served_model_name: str = SERVED_MODEL_NAME


def run_card_info(
    run_dir: Path, step: int | None, source: str, served_model_name: str = SERVED_MODEL_NAME
) -> CardInfo:
    """Stage, step, config and last held-out metrics of a run directory (whatever of them exists)."""
    info = CardInfo(step=step, source=source, served_model_name=served_model_name)
    cfg_file = run_dir / "config.yaml"
    if cfg_file.is_file():
        info.run_config_yaml = cfg_file.read_text()
        from omegaconf import OmegaConf

        info.stage = str(OmegaConf.load(cfg_file).get("run", {}).get("name", ""))
    metrics_file = run_dir / "metrics.jsonl"
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if step is not None and rec.get("step", 0) > step:
                continue
            ev = {k: v for k, v in rec.items() if k.startswith("eval/")}
            if ev:
                info.metrics.update(ev)
                info.metrics_step = rec.get("step")
    return info


def model_card(info: CardInfo, hf_config, dtype_name: str) -> str:
    metrics = "\n".join(f"| `{k}` | {v:.6g} |" for k, v in sorted(info.metrics.items()))
    lines = [
        "---",
        "library_name: transformers",
        "tags: [hy-memory, memory-writer, hy_v3]",
        "---",
        f"# {info.served_model_name}",
        "",
        "A memory-writer policy trained by hymem-train (OPD then RL, after the Hy-Memory-30B-A3B report).",
        "",
        f"- training stage: `{info.stage or 'unknown'}`",
        f"- step: {info.step if info.step is not None else 'unknown'}",
        f"- exported from: `{info.source}`",
        f"- weights: {dtype_name} (router gate and expert bias float32), "
        f"{hf_config.num_hidden_layers} layers, {hf_config.num_experts} experts, top-{hf_config.num_experts_per_tok}",
        f"- served model name: `{info.served_model_name}`",
        "",
        "## Serve",
        "",
        "```bash",
        f"vllm serve DIR --served-model-name {info.served_model_name}",
        "```",
        "",
        "or `AutoModelForCausalLM.from_pretrained(DIR)` / `AutoTokenizer.from_pretrained(DIR)`.",
        "",
        "## Held-out metrics",
        "",
    ]
    if metrics:
        lines += [
            f"Last held-out values in the run's metrics.jsonl (step {info.metrics_step}):",
            "",
            "| metric | value |",
            "|---|---|",
            metrics,
        ]
    else:
        lines += ["None recorded (the run logged no `eval/*` values up to this step)."]
    lines += ["", "## Experiment config", ""]
    lines += ["```yaml", info.run_config_yaml.rstrip(), "```"] if info.run_config_yaml else ["Not available."]
    return "\n".join(lines) + "\n"


# ---- the one writer both callers use -------------------------------------------------------------------
def write_hf_dir(
    tensors: Iterable[tuple[str, torch.Tensor]],
    hf_config,
    out: Path,
    *,
    dtype: torch.dtype | None,
    tokenizer,
    card: CardInfo,
    write: bool = True,
    max_shard_bytes: int = 5 * 10**9,
) -> None:
    """Consume `tensors` (transformers names, in `skeleton_entries` order) and, when `write`, build `out`
    via a temp dir and a rename. With `write=False` (ranks != 0) the iterator is still consumed."""
    plan: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    for name, shape, sdtype in skeleton_entries(hf_config):
        meta = torch.empty(shape, dtype=sdtype, device="meta")
        plan += [(n, tuple(v.shape), out_dtype(n, v, dtype)) for n, v in serving_tensors(name, meta)]
    tmp = out.with_name(out.name + ".tmp")
    writer = None
    if write:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        writer = ShardedSafetensorsWriter(tmp, plan, max_shard_bytes)
    expected = [n for n, _, _ in skeleton_entries(hf_config)]
    i = 0
    for name, t in tensors:
        if hf_config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if i >= len(expected) or name != expected[i]:
            raise ValueError(
                f"export: got {name!r}, expected {expected[i] if i < len(expected) else 'nothing'}"
            )
        i += 1
        if writer is not None:
            for n, v in serving_tensors(name, t):
                writer.write(n, v.to(out_dtype(n, v, dtype)))
    if i != len(expected):
        raise ValueError(
            f"export: the source ended after {i} of {len(expected)} tensors (next: {expected[i]!r})"
        )
    if writer is None:
        return
    writer.close()
    serving_config(hf_config, dtype).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(tmp)
    dtype_name = str(dtype or next(t for _, _, t in plan)).removeprefix("torch.")
    (tmp / "README.md").write_text(model_card(card, hf_config, dtype_name))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log.info("exported %s (%d tensors, %.1f MiB)", out, len(plan), writer.total_bytes / 2**20)


def _live_tensors(model, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in iter_full_param_buckets(model, bucket_bytes):  # collective under ZeRO-3
        yield from bucket
    yield from persistent_buffers(model).items()


def export_hf(trainer, model_cfg: ModelConfig, out: Path, bucket_mb: float = 256.0) -> None:
    """End of a stage: the trainer's current weights to `out` (`<run>/final`), in the training dtype.

    Collective (gathers ZeRO-3 shards one bucket at a time); rank 0 writes. The card reads the run's
    config.yaml and metrics.jsonl from `out`'s parent when they exist.
    """
    run_dir = Path(out).parent
    card = run_card_info(run_dir, trainer.step, f"{run_dir} (end of stage, trainer step {trainer.step})")
    tok = load_tokenizer_for(model_cfg) if trainer.rank == 0 else None
    write_hf_dir(
        _live_tensors(trainer.model, int(bucket_mb * 2**20)),
        trainer.model.config,
        Path(out),
        dtype=None,
        tokenizer=tok,
        card=card,
        write=trainer.rank == 0,
    )


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    fallback_model: ModelConfig | None = None,
    max_shard_bytes: int = 5 * 10**9,
    served_model_name: str = SERVED_MODEL_NAME,
) -> Path:
    """A step checkpoint (`<run>/checkpoints/step_N` or `<run>/checkpoints`) or an HF directory to `out`.

    One process: DeepSpeed step checkpoints are consolidated parameter by parameter from the ranks'
    memory-mapped partition files (hymem_train/models/checkpoint_files.py)."""

    checkpoint, out = Path(checkpoint), Path(out)
    tdtype = DTYPES[dtype]
    if checkpoint_kind(checkpoint) == "hf":
        from transformers import HYV3ForCausalLM

        # an HF dir in either layout (transformers' or ours): transformers reads it whole (an HF dir is
        # the size of one copy by construction), then it streams out like a live model
        model = HYV3ForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32)
        hf_config = model.config
        tensors: Iterable = _live_tensors(model, 256 << 20)
        card = run_card_info(checkpoint.parent, None, str(checkpoint))
        tok_cfg = ModelConfig(path=str(checkpoint))
    else:
        step_dir = step_dir_of(checkpoint)
        model_cfg, cfg_src = run_model_source(step_dir, fallback=fallback_model)
        hf_config = hf_config_for(model_cfg)
        weights = DeepSpeedWeights(step_dir)
        order = [n for n, _, _ in skeleton_entries(hf_config)]
        missing = sorted(set(order) - set(weights.names()))
        if missing:
            raise ValueError(f"{step_dir}: the checkpoint lacks {missing[:5]} (config from {cfg_src})")
        tensors = weights.iter_tensors(order)
        card = run_card_info(run_dir_of(step_dir), step_of(step_dir), f"{step_dir} ({weights.source})")
        # the tokenizer: the run's own setting, else the init checkpoint's if that is an HF dir, else shipped
        tok_path = model_cfg.tokenizer_path
        if not tok_path and model_cfg.path and checkpoint_kind(model_cfg.path) == "hf":
            tok_path = model_cfg.path
        tok_cfg = dataclasses.replace(model_cfg, path="", tokenizer_path=tok_path)
    card.served_model_name = served_model_name
    write_hf_dir(
        tensors,
        hf_config,
        out,
        dtype=tdtype,
        tokenizer=load_tokenizer_for(tok_cfg),
        card=card,
        max_shard_bytes=max_shard_bytes,
    )
    return out
