"""Run a Gateway's app under uvicorn in a background thread (tests, demo, rollout processes)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# How long the server keeps an idle keep-alive connection. It must outlast every client's own idle
# expiry (httpx and the openai SDK: 5 s), so a client always drops an idle connection before the server
# does; uvicorn's default (also 5 s) let a request meet the server's close (docs/log/findings.md, "Gateway").
KEEP_ALIVE_S = 75


def bind_host(host: str) -> str:
    """A gateway bind address; "auto" = this node's IP as Ray sees it (reachable from other nodes)."""
    if host != "auto":
        return host
    import ray.util

    return ray.util.get_node_ip_address()


class GatewayServer:
    def __init__(self, gateway, host: str | None = None, port: int | None = None):
        self.gateway = gateway
        self.host = bind_host(host or gateway.cfg.host)
        self.port = port or gateway.cfg.port or free_port(self.host)
        config = uvicorn.Config(
            gateway.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.gateway.close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
