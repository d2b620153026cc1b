"""HF transformers engine: padding-aware batched generation with a KV cache, on CPU (or one GPU).

The CPU stand-in for vLLM. It keeps the engine contract exactly: token ids in,
token ids + raw logprobs + routed experts out. Routes are captured by the routing hook
(models/routing.py) during prefill and every decode step and laid out as [P+R, L, E] per request,
the layout vLLM returns; the last sampled token is never forwarded, so its row is -1.

Batching is static per call: `generate` takes a list of prompts (the gateway's batcher collects
concurrent requests into one call) and left-pads them; position ids come from the attention mask
so a padded row computes the same as the request alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from hymem_train.engines.base import (
    GenerationOutput,
    SamplingParams,
    TopKLogprobs,
    check_lengths,
)
from hymem_train.models.routing import NOT_ROUTED, RoutingController

log = logging.getLogger(__name__)


def _filter_logits(logits_V: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p on one row of logits (sampling only; logprobs stay raw)."""
    x = logits_V / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = torch.topk(x, sp.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if sp.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_x, dim=-1) > sp.top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


class HFEngine:
    """Batched generation and teacher top-k scoring with a transformers HYV3 model."""

    full_vocab_logprobs = True  # topk_logprobs(k=vocab size) is affordable: OPD's held-out KL is exact

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        max_model_len: int = 4096,
        max_batch_size: int = 16,
        capture_routes: bool = True,
        seed: int = 0,
    ):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.policy_version = 0
        self._lock = threading.Lock()  # one forward at a time; weight updates wait for it
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self.routing = RoutingController.attach(model) if capture_routes else None
        self.asleep = False
        self._unsent: set[str] = (
            set()
        )  # weights not refilled by a sync since wake_up (silent failure serving-before-weights)

    # ---- generation ----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        self._check_awake()
        check_lengths(prompts, params, self.max_model_len)
        out: list[GenerationOutput] = []
        with self._lock, torch.inference_mode():
            for s in range(0, len(prompts), self.max_batch_size):
                out += self._generate_batch(
                    prompts[s : s + self.max_batch_size], params[s : s + self.max_batch_size]
                )
            for o in out:  # under the lock: no bucket of a sync lands in between
                o.policy_version = self.policy_version
        return out

    def _generate_batch(
        self, prompts: list[list[int]], params: list[SamplingParams]
    ) -> list[GenerationOutput]:
        B = len(prompts)
        S = max(len(p) for p in prompts)
        ids_BS = torch.full((B, S), self.pad_token_id, dtype=torch.long)
        mask_BS = torch.zeros((B, S), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token is at column S
            ids_BS[i, S - len(p) :] = torch.tensor(p)
            mask_BS[i, S - len(p) :] = 1
        ids_BS, mask_BS = ids_BS.to(self.device), mask_BS.to(self.device)
        pos_BS = (mask_BS.cumsum(-1) - 1).clamp(min=0)
        gens = [
            torch.Generator(device="cpu").manual_seed(sp.seed) if sp.seed is not None else self._rng
            for sp in params
        ]
        stops = [set(self.eos_token_ids) | set(sp.stop_token_ids) for sp in params]
        resp: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        finish: list[str | None] = [None] * B
        cache = DynamicCache(config=self.model.config)
        capture = self.routing.capture() if self.routing is not None else None
        rec = capture.__enter__() if capture is not None else None
        try:
            logits_BV = (
                self.model(
                    input_ids=ids_BS,
                    attention_mask=mask_BS,
                    position_ids=pos_BS,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1]
                .float()
            )
            next_pos_B = pos_BS[:, -1] + 1
            for _ in range(max(sp.max_tokens for sp in params)):
                logp_BV = F.log_softmax(logits_BV, dim=-1)
                step_ids = []
                for i in range(B):
                    if finish[i] is not None:
                        step_ids.append(self.pad_token_id)
                        continue
                    sp = params[i]
                    if sp.temperature == 0:
                        tok = int(torch.argmax(logits_BV[i]))
                    else:
                        probs = torch.softmax(_filter_logits(logits_BV[i].cpu(), sp), dim=-1)
                        tok = int(torch.multinomial(probs, 1, generator=gens[i]))
                    resp[i].append(tok)
                    lps[i].append(float(logp_BV[i, tok]))
                    if tok in stops[i]:
                        finish[i] = "stop"
                    elif len(resp[i]) >= sp.max_tokens:
                        finish[i] = "length"
                    step_ids.append(tok)
                if all(f is not None for f in finish):
                    break
                # finished rows keep stepping on a masked pad (their outputs are ignored)
                active_B = torch.tensor([f is None for f in finish], dtype=torch.long, device=self.device)
                mask_BS = torch.cat([mask_BS, active_B[:, None]], dim=1)
                logits_BV = (
                    self.model(
                        input_ids=torch.tensor(step_ids, device=self.device)[:, None],
                        attention_mask=mask_BS,
                        position_ids=next_pos_B[:, None],
                        cache=cache,
                        use_cache=True,
                    )
                    .logits[:, -1]
                    .float()
                )
                next_pos_B = next_pos_B + active_B
        finally:
            if capture is not None:
                capture.__exit__(None, None, None)
        routes = self._routes_per_request(rec, prompts, resp, S) if rec is not None else [None] * B
        return [
            GenerationOutput(
                response_ids=resp[i],
                logprobs=lps[i],
                finish_reason=finish[i] or "length",
                routed_experts_TLE=routes[i],
            )
            for i in range(B)
        ]

    @staticmethod
    def _routes_per_request(rec, prompts, resp, S) -> list[np.ndarray]:
        """Lay captured routes out per request as [P+R, L, E] (vLLM's layout), last row NOT_ROUTED."""
        B = len(prompts)
        prefill = rec.calls[0].reshape(B, S, rec.num_layers, -1)
        steps = rec.calls[1:]  # steps[j]: routes of response token j, fed at decode step j+1
        out = []
        for i, p in enumerate(prompts):
            rows = [prefill[i, S - len(p) :]]
            n_fed = len(resp[i]) - 1  # every response token but the last was forwarded
            if n_fed > 0:
                rows.append(np.stack([steps[j][i] for j in range(n_fed)]))
            last = np.full((1, rec.num_layers, prefill.shape[-1]), NOT_ROUTED, dtype=np.int16)
            rows.append(last)
            out.append(np.concatenate(rows, axis=0).astype(np.int16))
        return out

    # ---- teacher scoring -----------------------------------------------------------------------
    def topk_logprobs(
        self, sequences: list[list[int]], k: int, position_chunk: int = 1024
    ) -> list[TopKLogprobs]:
        """Top-k raw logprobs at every position; the lm_head runs in position chunks so the full
        [T, V] logits of a long sequence are never materialised at once."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self._check_awake()
        out: list[TopKLogprobs] = []
        with self._lock, torch.inference_mode():
            for seq_i, seq in enumerate(sequences):
                if not seq:
                    raise ValueError(f"sequence {seq_i} is empty")
                if len(seq) > self.max_model_len:
                    raise ValueError(
                        f"sequence {seq_i}: {len(seq)} tokens > max_model_len {self.max_model_len}"
                    )
                ids = torch.tensor([seq], device=self.device)
                h_TH = self.model.model(input_ids=ids).last_hidden_state[0]
                ids_chunks, lp_chunks = [], []
                for s in range(0, h_TH.shape[0], position_chunk):
                    logp_tV = F.log_softmax(self.model.lm_head(h_TH[s : s + position_chunk]).float(), dim=-1)
                    v, i = torch.topk(logp_tV, k, dim=-1)
                    ids_chunks.append(i.cpu())
                    lp_chunks.append(v.cpu())
                out.append(TopKLogprobs(ids_TK=torch.cat(ids_chunks), logprobs_TK=torch.cat(lp_chunks)))
        return out

    def token_logprobs(self, sequences: list[list[int]], position_chunk: int = 1024) -> list[np.ndarray]:
        """Raw log-prob of each next token: entry t scores token t+1 given tokens <= t ([T-1] float32)."""
        self._check_awake()
        out: list[np.ndarray] = []
        with self._lock, torch.inference_mode():
            for seq in sequences:
                ids = torch.tensor([seq], device=self.device)
                h_TH = self.model.model(input_ids=ids).last_hidden_state[0, :-1]
                nxt = ids[0, 1:]
                parts = []
                for s in range(0, h_TH.shape[0], position_chunk):
                    logp_tV = F.log_softmax(self.model.lm_head(h_TH[s : s + position_chunk]).float(), dim=-1)
                    parts.append(logp_tV.gather(1, nxt[s : s + position_chunk, None])[:, 0].cpu())
                out.append(torch.cat(parts).numpy() if parts else np.zeros(0, np.float32))
        return out

    # ---- colocated placement: no weights while the trainer steps -------------------------------
    def sleep(self) -> int:
        """Release every parameter's storage (vLLM's sleep level 2: the next sync brings the weights
        back, so nothing is kept); returns the bytes released."""
        with self._lock:
            freed = 0
            for p in self.model.parameters():
                freed += p.numel() * p.element_size()
                p.hymem_shape = tuple(p.shape)  # type: ignore[attr-defined]
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.asleep = True
        return freed

    def wake_up(self) -> None:
        """Allocate the parameters again, uninitialised: serving refuses until a sync has sent each one."""
        with self._lock:
            if not self.asleep:
                return
            for p in self.model.parameters():
                p.data = torch.empty(p.hymem_shape, dtype=p.dtype, device=p.device)  # type: ignore[attr-defined]
            self._unsent = {n for n, _ in self.model.named_parameters()}
            self.asleep = False

    def _check_awake(self) -> None:
        if self.asleep:
            raise RuntimeError(
                "the engine is asleep (colocated placement, the trainer is stepping): wake_up first"
            )
        if self._unsent:
            raise RuntimeError(
                f"{len(self._unsent)} weight(s) not sent since wake_up, e.g. {sorted(self._unsent)[:3]}: they hold "
                "uninitialised memory; the weight sync after wake_up must send every parameter"
            )

    # ---- weight sync ---------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Load one bucket of (name, tensor); unknown names or shapes raise before anything is copied."""
        named = list(named_tensors)
        state = dict(self.model.named_parameters())
        state.update(dict(self.model.named_buffers()))
        for name, t in named:
            if name not in state:
                raise KeyError(f"update_weights: engine model has no parameter {name!r}")
            if tuple(state[name].shape) != tuple(t.shape):
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(t.shape)}, engine expects {tuple(state[name].shape)}"
                )
        if self.asleep:
            raise RuntimeError("update_weights on a sleeping engine: wake_up first")
        with self._lock, torch.no_grad():
            for name, t in named:
                state[name].copy_(t.to(device=state[name].device, dtype=state[name].dtype))
                self._unsent.discard(name)
            self.policy_version = version
        return len(named)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        return self.update_weights(state_dict.items(), version)
