"""HTTP client for the gateway's admin endpoints: what rollout workers in other processes (Ray
actors) use to register a trajectory, declare the chunk being written, and collect the segments."""

from __future__ import annotations

import httpx

from hymem_train.segments import Segment


class GatewayAdmin:
    def __init__(self, url: str, admin_token: str, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        # a new connection per admin call (a handful per rollout, loopback): none is ever reused after
        # the server or a proxy between closed it, and none of these calls may be blindly retried
        # (register is refused twice; a drain whose answer was lost has lost its segments)
        self._http = httpx.Client(
            timeout=timeout_s,
            headers={"x-admin-token": admin_token},
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def _check(self, r: httpx.Response, what: str) -> dict:
        if r.status_code != 200:
            raise RuntimeError(f"gateway {what}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def register(self, trajectory_id: str, bank_id: str) -> str:
        r = self._http.post(
            f"{self.url}/admin/trajectories", json={"trajectory_id": trajectory_id, "bank_id": bank_id}
        )
        return self._check(r, f"register {trajectory_id}")["credential"]

    def set_chunk(self, trajectory_id: str, chunk_index: int) -> None:
        r = self._http.post(
            f"{self.url}/admin/trajectories/{trajectory_id}/chunk", json={"chunk_index": chunk_index}
        )
        self._check(r, f"set_chunk {trajectory_id}")

    def drain_segments(self, trajectory_id: str) -> list[Segment]:
        r = self._http.get(f"{self.url}/admin/segments/{trajectory_id}", params={"drain": "true"})
        return [Segment.from_dict(d) for d in self._check(r, f"segments {trajectory_id}")["segments"]]

    def drain_dropped(self, trajectory_id: str) -> list[dict]:
        """The trajectory's calls the gateway refused as over the prompt cap (`drop_chunk`)."""
        r = self._http.get(f"{self.url}/admin/trajectories/{trajectory_id}/dropped")
        return self._check(r, f"dropped {trajectory_id}")["dropped"]

    def unregister(self, trajectory_id: str) -> None:
        self._check(
            self._http.delete(f"{self.url}/admin/trajectories/{trajectory_id}"), f"unregister {trajectory_id}"
        )

    def metrics(self) -> dict[str, float]:
        return self._check(self._http.get(f"{self.url}/admin/metrics"), "metrics")

    def close(self) -> None:
        self._http.close()
