"""Probes scored per second: batched judge calls (many in flight) vs one at a time, same run.

    .venv/bin/python benchmarks/bench_reward.py [--probes 128] [--concurrency 32] [--latency-ms 20]
    .venv/bin/python benchmarks/bench_reward.py --base-url http://127.0.0.1:8002/v1 --model judge

Both arms run the real path: `LlmJudge.score_probes` -> `ChatClient` (openai AsyncOpenAI, strict
parsing, bounded retries). Without --base-url the endpoint is a local stand-in judge that answers
every request with a valid verdict after a fixed service time (--latency-ms): the ratio then measures
how well the client overlaps requests against an endpoint with spare capacity, not a model's batching.
With --base-url (vLLM on GPU, the HF engine's server on CPU) the ratio includes the engine's batching.
Prints probes/s for both arms and batched / one-at-a-time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reward.config import LlmClientConfig  # noqa: E402
from reward.judge import LlmJudge, ProbeItem  # noqa: E402
from reward.llm import ChatClient, Fault  # noqa: E402


def _serve_fixed_latency(latency_s: float, port_q: multiprocessing.Queue) -> None:
    """OpenAI-compatible /chat/completions answering '{"score": 1.0}' after `latency_s`.

    Runs in its own process so the server's threads do not compete with the client for the GIL.
    """

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def setup(self):
            super().setup()
            # headers and body go out as two writes: without TCP_NODELAY, Nagle + delayed ACK
            # add ~40 ms to every keep-alive request and would inflate the ratio
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            time.sleep(latency_s)
            data = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "judge"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": '{"score": 1.0}'},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default listen backlog of 5 drops SYNs under 32 concurrent clients
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    port_q.put(httpd.server_address[1])
    httpd.serve_forever()


def items(n: int) -> list[ProbeItem]:
    return [
        ProbeItem(
            f"bench probe {i}",
            f"Where did the user travel in month {i % 12 + 1}?",
            "Lisbon",
            "Full credit if the answer names Lisbon; partial if it names Portugal only.",
            "They went to Lisbon.",
        )
        for i in range(n)
    ]


def run_arm(base_url: str, model: str, n: int, concurrency: int) -> tuple[float, int]:
    cfg = LlmClientConfig(
        base_url=base_url, model=model, max_concurrency=concurrency, num_retries=2, retry_backoff_s=0.0
    )
    judge = LlmJudge(ChatClient(cfg))
    t0 = time.perf_counter()
    out = judge.score_probes(items(n))
    dt = time.perf_counter() - t0
    return n / dt, sum(isinstance(o, Fault) for o in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--model", default="judge")
    args = ap.parse_args()

    server = None
    base_url = args.base_url
    if base_url is None:
        port_q: multiprocessing.Queue = multiprocessing.Queue()
        server = multiprocessing.Process(
            target=_serve_fixed_latency, args=(args.latency_ms / 1000.0, port_q), daemon=True
        )
        server.start()
        base_url = f"http://127.0.0.1:{port_q.get(timeout=30)}/v1"
    try:
        run_arm(base_url, args.model, 4, 2)  # warm-up: imports, first connections
        one, f1 = run_arm(base_url, args.model, args.probes, 1)
        many, f2 = run_arm(base_url, args.model, args.probes, args.concurrency)
    finally:
        if server is not None:
            server.terminate()
            server.join()
    where = args.base_url or f"stand-in judge, {args.latency_ms:g} ms per request"
    print(f"endpoint: {where}; {args.probes} probes")
    print(f"one at a time      : {one:8.1f} probes/s  ({f1} faults)")
    print(f"batched (x{args.concurrency:<3d})     : {many:8.1f} probes/s  ({f2} faults)")
    print(f"ratio batched / one: {many / one:.2f}x")


if __name__ == "__main__":
    main()
