"""Bounded-retry, strictly parsed chat calls to a frozen model behind an OpenAI-compatible endpoint.

The reader and the judge are frozen models (vLLM on GPU, the HF engine on CPU); both are reached
through `ChatClient`. A call that times out, fails at the transport / server, or returns a reply its
parser rejects is retried `num_retries` times; if it still fails it comes back as a `Fault`, which
the reward code excludes from every denominator and counts (silent failure platform-error-as-reward): a judge outage must
never read as a 0 for the policy. Only a misconfigured endpoint (401 / 403 / 404: wrong key, URL
or model) raises, because it would otherwise exclude every item of every group quietly.

"Batched" means many requests in flight at once (`max_concurrency`): vLLM and the HF engine batch
concurrent requests into one forward; chat completions have no multi-prompt request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import openai

from reward.config import LlmClientConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
Message = dict[str, Any]


class EndpointError(RuntimeError):
    """The endpoint refuses us as configured (bad key, URL or model name): fail loudly, do not exclude."""


class ParseError(ValueError):
    """A reply that does not follow the output contract (retried, then a Fault)."""


@dataclass(frozen=True)
class Fault:
    """An item that could not be scored after bounded retries: excluded and counted, never scored."""

    kind: str  # "timeout" | "connection" | "http_<status>" | "parse"
    detail: str  # last error message, with the item id
    num_attempts: int  # calls made for this item


@dataclass(frozen=True)
class ChatRequest(Generic[T]):
    messages: list[Message]  # the full prompt
    parse: Callable[[str], T]  # strict parser of the reply text; raises ParseError
    where: str  # item id for error messages ("probe seq/c0001/p000, rollout 3")
    json_reply: bool = False  # this request's contract is a JSON object (json_mode applies)


_RETRYABLE_STATUS = {408, 409, 429}  # plus every 5xx
_FATAL_STATUS = {401, 403, 404}


class ChatClient:
    """Runs a batch of chat requests with bounded concurrency and bounded retries."""

    def __init__(self, cfg: LlmClientConfig):
        cfg.validate()
        self.cfg = cfg
        # calls, retries, faults, faults/<kind>; prompt_tokens, completion_tokens (the endpoint's usage)
        self.stats: Counter[str] = Counter()

    def run_batch(self, requests: Sequence[ChatRequest[T]]) -> list[T | Fault]:
        """Results in request order; a Fault where an item failed after its retries."""
        return [r for r, _ in self.run_batch_finish(requests)]

    def run_batch_finish(self, requests: Sequence[ChatRequest[T]]) -> list[tuple[T | Fault, str]]:
        """`run_batch` with each reply's `finish_reason` ("stop", "length" = cut at max_tokens; "" for a
        Fault), so a caller can count truncated answers instead of scoring them as if they were whole."""
        if not requests:
            return []
        return asyncio.run(self._run_batch(list(requests)))

    async def _run_batch(self, requests: list[ChatRequest[T]]) -> list[tuple[T | Fault, str]]:
        client = openai.AsyncOpenAI(
            base_url=self.cfg.base_url, api_key=self.cfg.api_key, timeout=self.cfg.timeout_s, max_retries=0
        )
        sem = asyncio.Semaphore(self.cfg.max_concurrency)
        try:

            async def one(req: ChatRequest[T]) -> tuple[T | Fault, str]:
                async with sem:
                    return await self._call(client, req)

            return list(await asyncio.gather(*(one(r) for r in requests)))
        finally:
            await client.close()

    async def _call(self, client: openai.AsyncOpenAI, req: ChatRequest[T]) -> tuple[T | Fault, str]:
        kind, detail = "parse", ""
        attempts = 0
        for attempt in range(self.cfg.num_retries + 1):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            attempts += 1
            self.stats["calls"] += 1
            try:
                kwargs: dict[str, Any] = {}
                if self.cfg.json_mode and req.json_reply:
                    kwargs["response_format"] = {"type": "json_object"}
                resp = await client.chat.completions.create(
                    model=self.cfg.model,
                    messages=req.messages,  # type: ignore[arg-type]
                    max_tokens=self.cfg.max_tokens,
                    temperature=self.cfg.temperature,
                    **kwargs,
                )
                if resp.usage is not None:  # spent even when the reply then fails to parse
                    self.stats["prompt_tokens"] += resp.usage.prompt_tokens or 0
                    self.stats["completion_tokens"] += resp.usage.completion_tokens or 0
                text = resp.choices[0].message.content if resp.choices else None
                if text is None:
                    raise ParseError("reply has no message content")
                finish = resp.choices[0].finish_reason or ""
                self.stats[f"finish/{finish or 'none'}"] += 1
                return req.parse(text), finish
            except ParseError as e:
                kind, detail = "parse", str(e)
            except openai.APITimeoutError as e:
                kind, detail = "timeout", str(e)
            except openai.APIConnectionError as e:
                kind, detail = "connection", str(e)
            except openai.APIStatusError as e:
                if e.status_code in _FATAL_STATUS:
                    raise EndpointError(
                        f"{self.cfg.base_url} model {self.cfg.model!r}: HTTP {e.status_code} for {req.where} "
                        f"({e.message}); check base_url / api_key / model"
                    ) from None
                kind, detail = f"http_{e.status_code}", e.message
                if not (e.status_code >= 500 or e.status_code in _RETRYABLE_STATUS):
                    break  # e.g. 400 prompt too long: the same request will fail the same way
            log.debug("%s: attempt %d failed (%s): %.200s", req.where, attempt + 1, kind, detail)
        self.stats["faults"] += 1
        self.stats[f"faults/{kind}"] += 1
        log.warning("%s: excluded after %d attempt(s): %s: %.200s", req.where, attempts, kind, detail)
        return Fault(kind=kind, detail=f"{req.where}: {detail}", num_attempts=attempts), ""
