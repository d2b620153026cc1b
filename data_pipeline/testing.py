"""A stand-in OpenAI-compatible server for tests (127.0.0.1 only) with scripted answers.

It speaks just enough of the OpenAI HTTP API for the real `openai` client: `POST /v1/chat/completions`
and `GET /v1/models`. A `responder(request_body) -> str | int` scripts each answer: a string is the
assistant message content (valid or deliberately malformed JSON), an int is an HTTP error status.
Every request body is kept in `requests`, so tests can count what was paid for.

    with StandInServer(lambda body: '{"score": 1}') as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x")
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], "str | int"]


class StandInServer:
    def __init__(self, responder: Responder, model: str = "stand-in"):
        self.responder = responder
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> StandInServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests.append(body)
                try:
                    answer = server.responder(body)
                except Exception as e:  # a broken script is a server error, visible to the client
                    self._send(500, {"error": {"message": f"responder failed: {e!r}"}})
                    return
                if isinstance(answer, int):
                    self._send(
                        answer, {"error": {"message": f"scripted status {answer}", "type": "server_error"}}
                    )
                    return
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
                                "message": {"role": "assistant", "content": answer},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                    },
                )

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def user_payload(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON task payload of an annotation request (the first user message)."""
    first_user = next(m for m in body["messages"] if m["role"] == "user")
    return json.loads(first_user["content"])


def num_attempts(body: dict[str, Any]) -> int:
    """0 for a first ask, k for the k-th re-ask after an invalid answer."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


# ---------------------------------------------------------------------------------------------------
# a scripted annotator: well-formed PRM / ORM answers derived from the request payload; tests inject
# malformed answers or HTTP errors through `override`. Facts carry "CANARY-" markers so leak tests can
# look for them in everything the bank, retrieval query and answer model see.


def good_prm(p: dict[str, Any]) -> dict[str, Any]:
    t = p["chunk_index"]
    prev = p["previous_facts"]
    return {
        "facts": [
            {
                "text": f"CANARY-F{t} fact of chunk {t}",
                "turn_ids": p["turn_ids"][:1],
                "supersedes": prev[-1]["fact_id"] if (t % 3 == 2 and prev) else "",
            }
        ],
        "probes": [
            {
                "kind": "transition" if (t % 3 == 2 and prev) else "plain_recall",
                "question": f"What happened in chunk {t}?",
                "reference": f"CANARY-R{t}",
                "rubric": "full credit for the reference",
                "fact_indices": [0],
            }
        ],
        "traps": [
            {"question": f"What snack did they eat in chunk {t}?", "rubric": "credit only 'no such record'"}
        ],
    }


def good_orm(p: dict[str, Any]) -> dict[str, Any]:
    wf, ef = p["window_facts"], p["earlier_facts"]
    gold = [wf[-1]["fact_id"], (ef[-1] if ef else wf[0])["fact_id"]]
    return {
        "questions": [
            {
                "question": f"What links window {p['window_index']}?",
                "answer": "CANARY-A",
                "gold_fact_ids": list(dict.fromkeys(gold)),
                "rubric": "credit per fact",
            }
        ]
    }


def pass_of(body: dict[str, Any]) -> str:
    return "prm" if "(PRM pass" in body["messages"][0]["content"] else "orm"


def annotator_responder(
    override: Callable[[str, dict[str, Any], int], Any] | None = None,
) -> Callable[[dict[str, Any]], str | int]:
    """Good answers, unless `override(pass, payload, attempt)` returns something (str / int / dict)."""

    def respond(body: dict[str, Any]) -> str | int:
        which, payload, attempt = pass_of(body), user_payload(body), num_attempts(body)
        if override is not None:
            out = override(which, payload, attempt)
            if out is not None:
                return out if isinstance(out, str | int) else json.dumps(out)
        return json.dumps(good_prm(payload) if which == "prm" else good_orm(payload))

    return respond
