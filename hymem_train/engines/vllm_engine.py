"""vLLM engine for GPU machines (optional extra: `pip install -e '.[vllm]'`).

Same contract as HFEngine. vLLM returns per-request `CompletionOutput.routed_experts` shaped
[P+R-1, L, E] when the engine is built with `enable_return_routed_experts=True` (the last sampled
token is never forwarded); we append the NOT_ROUTED row so the layout matches HFEngine's [P+R, L, E].
Teacher top-k uses `prompt_logprobs=k`: entry t of `prompt_logprobs` is the distribution of token t
given tokens < t, so our position t (predicting t+1) reads entry t+1; the last position reads the
logprobs of one generated step.

Weight sync goes through a worker extension (`WeightSyncExtension.update_weights`) called with
`collective_rpc`, so every tensor-parallel worker loads its shard through the model's own
`load_weights` (name mapping and sharding stay vLLM's job).

Not exercised on the CPU CI box (vLLM is GPU-only); tests marked `gpu` cover it on a GPU machine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from hymem_train.engines.base import GenerationOutput, SamplingParams, TopKLogprobs, check_lengths
from hymem_train.models.routing import NOT_ROUTED

log = logging.getLogger(__name__)


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # the message says what to do, not just what failed
        raise ImportError(
            "engine.kind=vllm needs vLLM, a GPU-only optional extra: `pip install -e '.[vllm]'` on a CUDA machine; "
            "on CPU use engine.kind=hf"
        ) from e
    return vllm


class WeightSyncExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`); receives one bucket per call."""

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        self.model_runner.model.load_weights(weights=[(n, t.to(device)) for n, t in named_tensors])  # type: ignore[attr-defined]
        return len(named_tensors)


class VLLMEngine:
    # vLLM's HYV3 `load_weights` reads the on-disk per-expert names, not the fused training names:
    # sync_weights maps them (trainer/weight_sync.as_served) before update_weights sees a bucket
    weight_names = "serving"

    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        max_model_len: int = 32_768,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        dtype: str = "bfloat16",
        capture_routes: bool = True,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        vllm = _import_vllm()
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = max_model_len
        self.policy_version = 0
        self.capture_routes = capture_routes
        self.llm = vllm.LLM(
            model=model_path,
            tokenizer=model_path,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            enable_return_routed_experts=capture_routes,
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
            **engine_kwargs,
        )

    def _sampling(self, sp: SamplingParams, **extra: Any):
        vllm = _import_vllm()
        return vllm.SamplingParams(
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else -1,
            seed=sp.seed,
            stop_token_ids=self.eos_token_ids + list(sp.stop_token_ids),
            logprobs=0,  # the sampled token's logprob only
            detokenize=False,
            **extra,
        )

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        check_lengths(prompts, params, self.max_model_len)
        reqs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(reqs, [self._sampling(sp) for sp in params], use_tqdm=False)
        results = []
        for p, o in zip(prompts, outs, strict=True):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)]
            routes = None
            if self.capture_routes:
                r = np.asarray(c.routed_experts, dtype=np.int16)
                if r.shape[0] != len(p) + len(ids) - 1:
                    raise RuntimeError(
                        f"vLLM returned {r.shape[0]} route rows for {len(p)}+{len(ids)} tokens"
                    )
                pad = np.full((1, *r.shape[1:]), NOT_ROUTED, dtype=np.int16)
                routes = np.concatenate([r, pad])
            reason = "stop" if c.finish_reason == "stop" else "length"
            results.append(GenerationOutput(ids, lps, reason, routes))
        return results

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        vllm = _import_vllm()
        sp = vllm.SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False
        )
        outs = self.llm.generate([{"prompt_token_ids": s} for s in sequences], sp, use_tqdm=False)
        results = []
        for seq_i, (seq, o) in enumerate(zip(sequences, outs, strict=True)):
            rows = list(o.prompt_logprobs[1:]) + [o.outputs[0].logprobs[0]]
            if len(rows) != len(seq) or any(r is None or len(r) < k for r in rows):
                # silent failure 2: a teacher that returns no top-k must stop the step, not train on nothing
                raise RuntimeError(f"teacher returned no top-{k} for some position of sequence {seq_i}")
            ids = torch.empty(len(seq), k, dtype=torch.long)
            lps = torch.empty(len(seq), k, dtype=torch.float32)
            for t, row in enumerate(rows):
                best = sorted(row.items(), key=lambda kv: kv[1].logprob, reverse=True)[:k]
                ids[t] = torch.tensor([tid for tid, _ in best])
                lps[t] = torch.tensor([lp.logprob for _, lp in best])
            results.append(TopKLogprobs(ids_TK=ids, logprobs_TK=lps))
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        bucket = [(n, t.detach().cpu()) for n, t in named_tensors]
        loaded = self.llm.collective_rpc("update_weights", args=(bucket,))
        self.policy_version = version
        return int(loaded[0]) if loaded else 0
