"""OpenAI-compatible gateway in front of the policy engine.

Every harness LLM call comes through here: the gateway checks the caller's trajectory identity
(silent failure shared-identity), applies the chat template, runs the engine (batched across concurrent callers),
and records a Segment with the exact token ids in and out (token-in/token-out: nothing is ever
re-tokenized), raw logprobs, routed experts and finish reason, tagged with the chunk index the
rollout declared (silent failure chunk-unmapped). Bad requests get OpenAI-style errors and are never recorded.

Context budgets (`GatewayConfig.max_prompt_tokens` / `max_response_tokens`, report: 28,672 +
4,096): a request's max_tokens is clamped to the response budget (counted); a prompt over the cap
is counted (`gateway/prompt_over_cap`), logged with its trajectory and chunk, and either refused
(`drop_chunk`: HTTP 400 `prompt_over_cap`, and the rollout worker collects the event and ends the
rollout as a platform_error, docs/glossary.md) or cut to its last `max_prompt_tokens` tokens
(`truncate_left`: the segment records the ids the engine saw, `meta["prompt_truncated_tokens"]`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hymem_train.engines.base import PromptTooLongError, SamplingParams
from hymem_train.gateway.batcher import Batcher, Continuous
from hymem_train.gateway.config import GatewayConfig
from hymem_train.gateway.embeddings import MiniLMEmbedder
from hymem_train.gateway.identity import IdentityError, IdentityMismatch, IdentityRegistry
from hymem_train.gateway.store import SegmentStore
from hymem_train.segments import Segment

log = logging.getLogger(__name__)

# Request fields we accept and ignore: they do not change what the policy samples here.
_IGNORED = {
    "user",
    "metadata",
    "store",
    "frequency_penalty",
    "presence_penalty",
    "response_format",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
    "stream_options",
    "service_tier",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "logit_bias",
}
_KNOWN = _IGNORED | {
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "n",
    "stop",
    "stream",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, code: str, type_: str = "invalid_request_error", param=None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.type, self.param = status, message, code, type_, param


def _error(
    status: int, message: str, code: str, type_: str = "invalid_request_error", param=None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": type_, "param": param, "code": code}},
    )


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep text parts only
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(
                    400, f"messages[{i}].content: only text parts are supported", "invalid_content"
                )
            parts.append(p["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "invalid_content")


class Gateway:
    """Holds the engine, tokenizer, identities and recorded segments; `app` is the FastAPI app."""

    def __init__(
        self,
        engine,
        tokenizer,
        cfg: GatewayConfig | None = None,
        store: SegmentStore | None = None,
        registry: IdentityRegistry | None = None,
        embedder=None,
    ):
        self.cfg = cfg or GatewayConfig()
        self.engine = engine
        self.tok = tokenizer
        self.store = store or SegmentStore()
        self.registry = registry or IdentityRegistry()
        self.admin_token = self.cfg.admin_token or secrets.token_urlsafe(16)
        # an engine that batches continuously (vLLM's async engine) gets every request as it arrives
        self.batcher = (
            Continuous(engine)
            if getattr(engine, "continuous_batching", False)
            else Batcher(engine, self.cfg.max_batch_size, self.cfg.batch_wait_ms / 1000)
        )
        if embedder is None and self.cfg.embeddings:
            embedder = MiniLMEmbedder()
        self.embedder = embedder
        self.counters = {
            "requests_ok": 0,
            "bad_request": 0,
            "engine_error": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "embedding_requests": 0,
            "prompt_over_cap": 0,
            "prompt_truncated_tokens": 0,
            "max_tokens_clamped": 0,
        }
        # trajectory -> the calls refused by `prompt_over_cap: drop_chunk` (the worker drains them)
        self.dropped: dict[str, list[dict[str, int]]] = {}
        self._dropped_lock = threading.Lock()
        self.app = self._build_app()

    # ---- in-process control (rollout workers in the same process use these directly) ----------
    def register(self, trajectory_id: str, bank_id: str) -> str:
        return self.registry.register(trajectory_id, bank_id)

    def set_chunk(self, trajectory_id: str, chunk_index: int) -> None:
        self.registry.set_chunk(trajectory_id, chunk_index)

    def drain_dropped(self, trajectory_id: str) -> list[dict[str, int]]:
        """The trajectory's calls refused as over the prompt cap (`drop_chunk`), and forget them."""
        with self._dropped_lock:
            return self.dropped.pop(trajectory_id, [])

    def forget(self, trajectory_id: str) -> int:
        """A trajectory whose worker died mid-rollout: drop its identity (later calls under it are refused),
        its recorded segments and refused calls. Returns the segments dropped."""
        self.registry.unregister(trajectory_id)
        self.drain_dropped(trajectory_id)
        return len(self.store.drain(trajectory_id))

    def metrics(self) -> dict[str, float]:
        m = {f"gateway/{k}": float(v) for k, v in self.counters.items()}
        m.update({f"gateway/rejected_{k}": float(v) for k, v in self.registry.rejected.items()})
        sizes = list(self.batcher.batch_sizes)  # one snapshot: the batcher thread appends to it
        m["gateway/mean_batch_size"] = float(sum(sizes) / len(sizes)) if sizes else 0.0
        m["gateway/engine_batches"] = float(len(sizes))  # batched engine calls
        m["gateway/batched_requests"] = float(sum(sizes))  # the requests they carried
        if seen := list(getattr(self.batcher, "in_flight_seen", [])):  # continuous batching
            m["gateway/mean_in_flight"] = float(sum(seen) / len(seen))
        m["gateway/segments"] = float(len(self.store))
        return m

    def close(self) -> None:
        self.batcher.close()

    # ---- HTTP ---------------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI(title="hymem-train gateway")

        @app.exception_handler(ApiError)
        async def _api_error(_: Request, e: ApiError):
            self.counters["bad_request"] += 1
            log.warning("gateway refused a request (%s, HTTP %d): %s", e.code, e.status, e.message)
            return _error(e.status, e.message, e.code, e.type, e.param)

        @app.exception_handler(IdentityError)
        async def _identity_error(_: Request, e: IdentityError):
            return _error(
                e.status, str(e), e.code, "authentication_error" if e.status == 401 else "permission_error"
            )

        @app.get("/health")
        async def health():
            return {"ok": True, "policy_version": self.engine.policy_version}

        @app.get("/v1/models")
        async def models():
            data = [{"id": self.cfg.served_model_name, "object": "model", "owned_by": "hymem-train"}]
            if self.embedder is not None:
                data.append({"id": self.embedder.name, "object": "model", "owned_by": "hymem-train"})
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self._chat(request, claimed_trajectory=None)

        @app.post("/t/{trajectory_id}/v1/chat/completions")
        async def chat_scoped(trajectory_id: str, request: Request):
            return await self._chat(request, claimed_trajectory=trajectory_id)

        @app.post("/v1/embeddings")
        async def embeddings(request: Request):
            return await self._embeddings(request, None)

        @app.post("/t/{trajectory_id}/v1/embeddings")
        async def embeddings_scoped(trajectory_id: str, request: Request):
            return await self._embeddings(request, trajectory_id)

        def _admin(request: Request) -> None:
            if not secrets.compare_digest(request.headers.get("x-admin-token", ""), self.admin_token):
                raise ApiError(
                    401, "admin endpoint needs X-Admin-Token", "invalid_admin_token", "authentication_error"
                )

        @app.post("/admin/trajectories")
        async def register(request: Request):
            _admin(request)
            body = await _json_body(request)
            try:
                cred = self.registry.register(str(body["trajectory_id"]), str(body["bank_id"]))
            except KeyError as e:
                raise ApiError(400, f"missing field {e.args[0]}", "missing_field") from None
            except ValueError as e:
                raise ApiError(409, str(e), "conflict") from None
            return {"credential": cred}

        @app.post("/admin/trajectories/{trajectory_id}/chunk")
        async def set_chunk(trajectory_id: str, request: Request):
            _admin(request)
            body = await _json_body(request)
            try:
                self.registry.set_chunk(trajectory_id, int(body["chunk_index"]))
            except (KeyError, ValueError, TypeError) as e:
                raise ApiError(400, f"set_chunk: {e}", "bad_chunk") from None
            return {"ok": True}

        @app.delete("/admin/trajectories/{trajectory_id}")
        async def unregister(trajectory_id: str, request: Request):
            _admin(request)
            self.registry.unregister(trajectory_id)
            self.drain_dropped(trajectory_id)
            return {"ok": True}

        @app.get("/admin/trajectories/{trajectory_id}/dropped")
        async def dropped(trajectory_id: str, request: Request):
            _admin(request)
            return {"dropped": self.drain_dropped(trajectory_id)}

        @app.get("/admin/segments/{trajectory_id}")
        async def segments(trajectory_id: str, request: Request, drain: bool = False):
            _admin(request)
            segs = self.store.drain(trajectory_id) if drain else self.store.get(trajectory_id)
            return {"segments": [s.to_dict() for s in segs]}

        @app.get("/admin/metrics")
        async def metrics(request: Request):
            _admin(request)
            return self.metrics()

        return app

    def _parse_chat(self, body: dict[str, Any]) -> tuple[list[dict[str, str]], SamplingParams]:
        unknown = sorted(set(body) - _KNOWN)
        if unknown:
            raise ApiError(
                400, f"unsupported field(s): {', '.join(unknown)}", "unsupported_field", param=unknown[0]
            )
        model = body.get("model")
        if model != self.cfg.served_model_name:
            raise ApiError(
                404,
                f"model {model!r} not served here; use {self.cfg.served_model_name!r}",
                "model_not_found",
                param="model",
            )
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages must be a non-empty list", "invalid_messages", param="messages")
        clean = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in (
                "system",
                "user",
                "assistant",
                "tool",
                "developer",
            ):
                raise ApiError(
                    400, f"messages[{i}] needs a role in system/user/assistant/tool", "invalid_messages"
                )
            role = "system" if m["role"] == "developer" else m["role"]
            clean.append({"role": role, "content": _content_text(m.get("content"), i)})
        if body.get("stream"):
            raise ApiError(
                400, "stream=true is not supported (segments are recorded whole)", "unsupported_stream"
            )
        if body.get("n", 1) != 1:
            raise ApiError(400, "n must be 1: each rollout is its own trajectory", "unsupported_n", param="n")
        if body.get("stop"):
            raise ApiError(
                400,
                "stop strings are not supported: responses must stay token-exact (EOS stops)",
                "unsupported_stop",
                param="stop",
            )
        try:
            max_tokens = (
                body.get("max_tokens") or body.get("max_completion_tokens") or self.cfg.default_max_tokens
            )
            sp = SamplingParams(
                max_tokens=int(max_tokens),
                temperature=float(
                    body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0
                ),
                top_p=float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0),
                top_k=int(body.get("top_k") or 0),
                seed=int(body["seed"]) if body.get("seed") is not None else None,
            )
            sp.validate()
        except (TypeError, ValueError) as e:
            raise ApiError(400, f"bad sampling parameter: {e}", "invalid_sampling") from None
        return clean, sp

    async def _chat(self, request: Request, claimed_trajectory: str | None):
        body = await _json_body(request)
        if self.cfg.frozen:
            return await self._frozen_chat(body)
        # identity first: an unidentified caller learns nothing about the request format
        ident = self.registry.resolve(
            _bearer(request), claimed_trajectory, request.headers.get("x-hymem-bank"), need_chunk=True
        )
        chunk_index = ident.chunk_index
        claimed_chunk = request.headers.get("x-hymem-chunk-index")
        if claimed_chunk is not None and claimed_chunk.strip() != str(chunk_index):
            # the harness says it is writing another chunk than the rollout declared: refuse rather
            # than record a segment under the wrong chunk (silent failure chunk-unmapped)
            self.registry.rejected["mismatch"] += 1
            raise IdentityMismatch(
                f"request claims chunk {claimed_chunk!r}, trajectory {ident.trajectory_id!r} is on chunk {chunk_index}"
            )
        prompt_ids, sp, n_cut = self._prompt(body, ident.trajectory_id, chunk_index)
        if sp.seed is None:
            # a seed fixed by (run, trajectory, chunk, call): sampling does not depend on which other
            # requests shared the batch, so a resumed run re-samples exactly what the killed one did
            sp.seed = _stable_seed(
                self.cfg.seed,
                ident.trajectory_id,
                chunk_index,
                self.registry.peek_call_index(ident, chunk_index),
            )
        try:
            out = await self.batcher.generate(prompt_ids, sp)
        except PromptTooLongError as e:
            raise ApiError(400, str(e), "context_length_exceeded") from None
        except Exception as e:
            self.counters["engine_error"] += 1
            log.exception("engine failure")
            return _error(500, f"engine error: {type(e).__name__}: {e}", "engine_error", "server_error")
        call_index = self.registry.next_call_index(ident, chunk_index)
        seg = Segment(
            trajectory_id=ident.trajectory_id,
            chunk_index=chunk_index,
            call_index=call_index,
            prompt_ids=prompt_ids,
            response_ids=out.response_ids,
            logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            routed_experts_TLK=out.routed_experts_TLE,
            bank_id=ident.bank_id,
            policy_version=out.policy_version
            if out.policy_version is not None
            else self.engine.policy_version,
            meta={"prompt_truncated_tokens": n_cut} if n_cut else {},
        )
        self.store.add(seg)
        self.counters["requests_ok"] += 1
        self.counters["prompt_tokens"] += len(prompt_ids)
        self.counters["completion_tokens"] += len(out.response_ids)
        return self._completion(f"chatcmpl-{ident.trajectory_id}-{chunk_index}-{call_index}", prompt_ids, out)

    async def _frozen_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A frozen model serves evaluation calls (reader, judge): nothing to identify or record."""
        prompt_ids, sp, _ = self._prompt(body, "frozen", -1)
        try:
            out = await self.batcher.generate(prompt_ids, sp)
        except PromptTooLongError as e:
            raise ApiError(400, str(e), "context_length_exceeded") from None
        except Exception as e:  # the engine's reason reaches the client (it names a prompt it refuses)
            self.counters["engine_error"] += 1
            log.exception("engine failure")
            return _error(500, f"engine error: {type(e).__name__}: {e}", "engine_error", "server_error")
        self.counters["requests_ok"] += 1
        return self._completion(f"chatcmpl-frozen-{self.counters['requests_ok']}", prompt_ids, out)

    def _prompt(
        self, body: dict[str, Any], trajectory_id: str, chunk_index: int
    ) -> tuple[list[int], SamplingParams, int]:
        """Validated request -> the exact prompt ids (chat template applied once, here), sampling
        params within the context budgets, and how many prompt tokens `truncate_left` cut."""
        messages, sp = self._parse_chat(body)
        prompt_ids = list(
            self.tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        budget = self.cfg.max_response_tokens
        if budget and sp.max_tokens > budget:
            self.counters["max_tokens_clamped"] += 1
            sp.max_tokens = budget
        n_cut = 0
        cap = self.cfg.max_prompt_tokens
        if cap and len(prompt_ids) > cap:
            self.counters["prompt_over_cap"] += 1
            action = self.cfg.prompt_over_cap
            log.warning(
                "gateway/prompt_over_cap: trajectory %s chunk %d: prompt of %d tokens > "
                "gateway.max_prompt_tokens %d (%s)",
                trajectory_id,
                chunk_index,
                len(prompt_ids),
                cap,
                action,
            )
            if action == "drop_chunk":
                with self._dropped_lock:
                    self.dropped.setdefault(trajectory_id, []).append(
                        {"chunk_index": chunk_index, "prompt_tokens": len(prompt_ids)}
                    )
                raise ApiError(
                    400,
                    f"prompt is {len(prompt_ids)} tokens, over gateway.max_prompt_tokens {cap} "
                    f"(gateway.prompt_over_cap=drop_chunk)",
                    "prompt_over_cap",
                )
            n_cut = len(prompt_ids) - cap
            self.counters["prompt_truncated_tokens"] += n_cut
            prompt_ids = prompt_ids[n_cut:]
        if len(prompt_ids) + sp.max_tokens > self.engine.max_model_len:
            raise ApiError(
                400,
                f"prompt is {len(prompt_ids)} tokens; with max_tokens {sp.max_tokens} it exceeds "
                f"the context of {self.engine.max_model_len}",
                "context_length_exceeded",
            )
        return prompt_ids, sp, n_cut

    def _completion(self, cid: str, prompt_ids: list[int], out) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.cfg.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.response_text(out)},
                    "finish_reason": out.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out.response_ids),
                "total_tokens": len(prompt_ids) + len(out.response_ids),
            },
        }

    def response_text(self, out) -> str:
        """The text a client receives: the response ids minus the final stop token, decoded verbatim."""
        ids = out.response_ids[:-1] if out.finish_reason == "stop" else out.response_ids
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def _embeddings(self, request: Request, claimed_trajectory: str | None):
        body = await _json_body(request)
        self.registry.resolve(
            _bearer(request), claimed_trajectory, request.headers.get("x-hymem-bank"), need_chunk=False
        )
        if self.embedder is None:
            raise ApiError(404, "this gateway serves no embeddings", "model_not_found")
        inp = body.get("input")
        texts = [inp] if isinstance(inp, str) else inp
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ApiError(
                400, "input must be a string or a non-empty list of strings", "invalid_input", "input"
            )
        if body.get("model") not in (
            None,
            self.embedder.name,
            "text-embedding-3-small",
            "text-embedding-ada-002",
        ):
            raise ApiError(
                404,
                f"embedding model {body.get('model')!r} not served; use {self.embedder.name!r}",
                "model_not_found",
                param="model",
            )

        vecs = await asyncio.get_running_loop().run_in_executor(None, self.embedder.embed, texts)
        self.counters["embedding_requests"] += 1
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)],
            "model": self.embedder.name,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }


def _stable_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:4], "little")


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}", "malformed_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", "malformed_json")
    return body
