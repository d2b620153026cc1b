"""A stand-in OpenAI-compatible server for tests (chat completions + embeddings), stdlib only.

It plays the gateway, an annotator or a judge while no real model is in the loop: scripted chat
replies, deterministic embeddings, per-key identity checks (silent failure shared-identity), and a record of every
request so tests can count LLM calls (what was paid for) and check the headers a caller sent.

    with StandInServer(replies=['{"ops":[{"op":"ADD","text":"x"}]}']) as srv:
        Endpoint(base_url=srv.base_url, api_key="traj-0", model="m")
    with StandInServer(lambda body: '{"score": 1}') as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x")

Replies: a list (consumed in order; the last one repeats), or a callable `(request_json) -> reply`;
`honour_max_tokens=True` cuts a reply at the request's max_tokens (finish_reason "length").
A reply is a string (the assistant content, valid or deliberately malformed JSON), an `HttpFailure`
(status code, optional delay), or an int (shorthand for an HTTP error with that status). A callable
that raises answers HTTP 500. `requests` keeps every request (path, key, headers, body, status);
`chat_bodies()` gives the JSON bodies of the chat calls.

Not only a test double: the shipped benchmark benchmarks/bench_harness_fork.py uses it to script the
policy's replies (imported as `tests.doubles.openai_server` with the repo root on sys.path).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

EMBED_DIM = 384  # MiniLM-L6's width, so the same store config works with the real embedder


@dataclasses.dataclass(frozen=True)
class HttpFailure:
    status: int = 500  # HTTP status to answer with
    delay_s: float = 0.0  # sleep first (timeouts)
    body: str = "stand-in failure"  # response text


Reply = str | int | HttpFailure


@dataclasses.dataclass
class RecordedRequest:
    path: str
    api_key: str | None
    headers: dict[str, str]
    body: dict[str, Any]
    status: int  # what the server answered


def hash_embedding(text: str, dim: int = EMBED_DIM) -> list[float]:
    """Bag-of-words feature hashing, L2-normalised: texts sharing words get a high cosine.

    Cheap and deterministic, so retrieval tests do not need a model; real runs use MiniLM.
    """
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vec[h % dim] += 1.0 if (h >> 63) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0.0:
        vec[0] = 1.0
        return vec
    return [v / norm for v in vec]


def usage(body: dict[str, Any], reply: str) -> dict[str, int]:
    """OpenAI `usage` counted in whitespace words: prompt = every message's text, completion = the reply."""
    texts = []
    for m in body.get("messages", []):
        c = m.get("content")
        texts += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    n_prompt, n_reply = sum(len(t.split()) for t in texts), len(str(reply).split())
    return {"prompt_tokens": n_prompt, "completion_tokens": n_reply, "total_tokens": n_prompt + n_reply}


class StandInServer:
    def __init__(
        self,
        replies: list[Reply] | Callable[[dict[str, Any]], Reply] | None = None,
        *,
        allowed_keys: set[str] | None = None,
        embed_fn: Callable[[list[str]], list[list[float]]] | None = None,
        host: str = "127.0.0.1",
        model: str = "stand-in",
        honour_max_tokens: bool = False,
    ):
        self._replies = replies if replies is not None else ['{"ops": [{"op": "NONE"}]}']
        self._reply_idx = 0
        self.allowed_keys = allowed_keys
        self.embed_fn = embed_fn or (lambda texts: [hash_embedding(t) for t in texts])
        self.model = model  # the id GET /v1/models lists, and the default "model" of a completion
        # cut a reply at the request's max_tokens (in whitespace words, as `usage` counts) with
        # finish_reason "length", as a real server does; off: the scripted reply is sent whole
        self.honour_max_tokens = honour_max_tokens
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._stopped = False

    # ---- public
    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def set_replies(self, replies: list[Reply] | Callable[[dict[str, Any]], Reply]) -> None:
        with self._lock:
            self._replies, self._reply_idx = replies, 0

    def chat_requests(self, status: int | None = 200) -> list[RecordedRequest]:
        """The chat-completion requests answered with `status` (None: all of them)."""
        return [
            r for r in self.requests if r.path.endswith("/chat/completions") and status in (None, r.status)
        ]

    def chat_bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of every chat-completion request, whatever was answered (paid calls)."""
        return [r.body for r in self.chat_requests(None)]

    def start(self) -> StandInServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- internals
    def _next_reply(self, body: dict[str, Any]) -> str | HttpFailure:
        with self._lock:
            if callable(self._replies):
                try:
                    r = self._replies(body)
                except Exception as e:  # a broken script is a server error, visible to the client
                    return HttpFailure(500, body=f"responder failed: {e!r}")
            elif not self._replies:
                return HttpFailure(500, body="stand-in: no scripted reply")
            else:
                r = self._replies[min(self._reply_idx, len(self._replies) - 1)]
                self._reply_idx += 1
        if isinstance(r, int):  # shorthand for an HTTP error with that status
            return HttpFailure(r, body=f"scripted status {r}")
        return r

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # the client timed out or was killed: expected in crash tests
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def _record(self, body: dict[str, Any], status: int) -> None:
                auth = self.headers.get("Authorization", "")
                key = auth[7:] if auth.startswith("Bearer ") else None
                with server._lock:
                    server.requests.append(RecordedRequest(self.path, key, dict(self.headers), body, status))

            def _authorized(self) -> bool:
                if server.allowed_keys is None:
                    return True
                auth = self.headers.get("Authorization", "")
                return auth.startswith("Bearer ") and auth[7:] in server.allowed_keys

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    self._record({}, 400)
                    return self._send(400, {"error": {"message": "body is not JSON"}})
                if not self._authorized():
                    self._record(body, 401)
                    return self._send(401, {"error": {"message": "unknown credential for this sandbox"}})
                if self.path.endswith("/chat/completions"):
                    return self._chat(body)
                if self.path.endswith("/embeddings"):
                    return self._embeddings(body)
                self._record(body, 404)
                self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _chat(self, body: dict[str, Any]) -> None:
                reply = server._next_reply(body)
                if isinstance(reply, HttpFailure):
                    time.sleep(reply.delay_s)
                    self._record(body, reply.status)
                    return self._send(
                        reply.status, {"error": {"message": reply.body, "type": "server_error"}}
                    )
                self._record(body, 200)
                finish, budget = "stop", body.get("max_tokens")
                if server.honour_max_tokens and budget and len(str(reply).split()) > budget:
                    reply, finish = " ".join(str(reply).split()[:budget]), "length"
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", server.model),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply},
                                "finish_reason": finish,
                            }
                        ],
                        "usage": usage(body, reply),
                    },
                )

            def _embeddings(self, body: dict[str, Any]) -> None:
                inp = body.get("input", [])
                texts = [inp] if isinstance(inp, str) else list(inp)
                if texts and not isinstance(texts[0], str):
                    self._record(body, 400)
                    return self._send(400, {"error": {"message": "token-id input not supported"}})
                vecs: list[Any] = server.embed_fn(texts)
                if body.get("encoding_format") == "base64":  # the openai client asks for this by default
                    vecs = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vecs]
                self._record(body, 200)
                self._send(
                    200,
                    {
                        "object": "list",
                        "model": body.get("model", "stand-in-embed"),
                        "data": [
                            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)
                        ],
                        "usage": {"prompt_tokens": 0, "total_tokens": 0},
                    },
                )

        return Handler
