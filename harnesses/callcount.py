"""Count (and tag) the LLM calls a framework makes, without touching its code.

Installed in a sandbox process only. Every mem0/MemOS/hy-memory LLM request goes through an
`httpx`/`httpx2` client (the openai SDK); we wrap `Client.send` / `AsyncClient.send` so that
- each `/chat/completions` request to the gateway is counted (WriteResult.num_llm_calls), and
- it carries `X-Hymem-Chunk-Index`, so the gateway files the segment under the right chunk
  (silent failure chunk-unmapped) even though the framework builds its own requests.
Requests to other hosts are counted separately: an offline harness must make none (test asserts).
"""

from __future__ import annotations

import importlib
import json
import threading
from urllib.parse import urlsplit

CHUNK_INDEX_HEADER = "X-Hymem-Chunk-Index"


class CallCounter:
    def __init__(self) -> None:
        self.allowed_netlocs: set[str] | None = None  # host:port of the gateway / embedder (None: any)
        self.num_chat_calls = 0  # chat completions sent to the gateway
        self.num_embedding_calls = 0  # embedding requests sent to the gateway
        self.num_foreign_calls = 0  # requests to any other host (must stay 0 offline)
        self.foreign_urls: list[str] = []  # the first few of them, for the error message
        self.chunk_index: int | None = None  # set around one write_chunk
        self.replies: list[str | None] = []  # assistant contents of answered chat calls, in order
        # chat calls whose reply never came in time: the writer's own failure (WriteResult.writer_timeout),
        # seen here because a framework may swallow the exception and report only a message
        self.num_chat_timeouts = 0
        self._lock = threading.Lock()

    def observe(self, request) -> None:  # request: httpx.Request
        url = str(request.url)
        with self._lock:
            if self.allowed_netlocs is not None and urlsplit(url).netloc not in self.allowed_netlocs:
                self.num_foreign_calls += 1
                if len(self.foreign_urls) < 5:
                    self.foreign_urls.append(url)
                return
            path = request.url.path
            if path.endswith("/chat/completions"):
                self.num_chat_calls += 1
                if self.chunk_index is not None:
                    request.headers[CHUNK_INDEX_HEADER] = str(self.chunk_index)
            elif path.endswith("/embeddings"):
                self.num_embedding_calls += 1

    def record_reply(self, body: bytes) -> None:
        """Keep the assistant content of a chat reply, so an adapter can judge the policy's output
        itself instead of trusting a framework that repairs or swallows malformed JSON (silent failure malformed-as-platform-error)."""
        try:
            content = json.loads(body)["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            content = None  # streamed or odd body: the adapter treats it as unknown
        with self._lock:
            self.replies.append(content)


def is_timeout(error: BaseException | None) -> bool:
    """Whether an exception, or one it was raised from, is a timeout (httpx's TimeoutException, openai's
    APITimeoutError, TimeoutError). Read by class name: the clients are the framework venv's own."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TimeoutError) or any("Timeout" in c.__name__ for c in type(error).__mro__):
            return True
        error = error.__cause__ or error.__context__
    return False


def _timed_out(request, error: BaseException) -> None:
    if _is_chat(request) and is_timeout(error):
        with COUNTER._lock:
            COUNTER.num_chat_timeouts += 1


def _is_chat(request) -> bool:
    return request.url.path.endswith("/chat/completions")


COUNTER = CallCounter()
_installed = False


def install(allowed_base_urls: list[str]) -> CallCounter:
    """Patch httpx/httpx2 once per process; idempotent. `allowed_base_urls`: the gateway and embedder."""
    global _installed
    COUNTER.allowed_netlocs = {urlsplit(u).netloc for u in allowed_base_urls} or None
    if _installed:
        return COUNTER
    # openai>=3 sends through `httpx2`, older stacks through `httpx`: wrap whichever is present
    for name in ("httpx", "httpx2"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        _wrap(mod.Client, mod.AsyncClient)
    _installed = True
    return COUNTER


def _wrap(client_cls, async_client_cls) -> None:
    orig_send, orig_async_send = client_cls.send, async_client_cls.send

    def send(self, request, *args, **kwargs):
        COUNTER.observe(request)
        try:
            response = orig_send(self, request, *args, **kwargs)
        except Exception as e:
            _timed_out(request, e)
            raise
        if _is_chat(request) and response.status_code == 200:
            response.read()  # cached by httpx: the framework still reads the same bytes
            COUNTER.record_reply(response.content)
        return response

    async def async_send(self, request, *args, **kwargs):
        COUNTER.observe(request)
        try:
            response = await orig_async_send(self, request, *args, **kwargs)
        except Exception as e:
            _timed_out(request, e)
            raise
        if _is_chat(request) and response.status_code == 200:
            await response.aread()
            COUNTER.record_reply(response.content)
        return response

    client_cls.send = send
    async_client_cls.send = async_send
