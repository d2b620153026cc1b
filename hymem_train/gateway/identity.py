"""Per-trajectory credentials (silent failure shared-identity: a sandbox sharing trajectory identity).

Each rollout registers (trajectory id, bank id) and receives a fresh secret credential that its
sandbox uses as the OpenAI API key. The rollout also tells the gateway which chunk it is writing
(`set_chunk`), so every recorded segment carries its chunk index (silent failure chunk-unmapped: a segment with
no chunk is refused at the door, not broadcast a score later). A request whose credential is unknown,
or whose claimed trajectory/bank (URL path or headers) disagrees with the credential, is rejected and
counted.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field


class IdentityError(Exception):
    status = 401
    code = "invalid_api_key"


class UnknownIdentity(IdentityError):
    pass


class IdentityMismatch(IdentityError):
    status = 403
    code = "identity_mismatch"


class NoChunkSet(IdentityError):
    status = 409
    code = "no_chunk_index"


@dataclass
class TrajectoryIdentity:
    trajectory_id: str
    bank_id: str
    credential: str
    chunk_index: int = -1  # -1: the rollout has not declared a chunk yet
    calls_per_chunk: dict[int, int] = field(default_factory=dict)


class IdentityRegistry:
    def __init__(self) -> None:
        self._by_cred: dict[str, TrajectoryIdentity] = {}
        self._by_traj: dict[str, TrajectoryIdentity] = {}
        self._lock = threading.Lock()
        self.rejected: dict[str, int] = {"unknown": 0, "mismatch": 0, "no_chunk": 0}

    def register(self, trajectory_id: str, bank_id: str, credential: str | None = None) -> str:
        with self._lock:
            if trajectory_id in self._by_traj:
                raise ValueError(f"trajectory {trajectory_id!r} is already registered")
            cred = credential or f"hm-{secrets.token_urlsafe(18)}"
            if cred in self._by_cred:
                raise ValueError("credential already in use by another trajectory")
            ident = TrajectoryIdentity(trajectory_id, bank_id, cred)
            self._by_cred[cred] = ident
            self._by_traj[trajectory_id] = ident
            return cred

    def unregister(self, trajectory_id: str) -> None:
        with self._lock:
            ident = self._by_traj.pop(trajectory_id, None)
            if ident is not None:
                self._by_cred.pop(ident.credential, None)

    def set_chunk(self, trajectory_id: str, chunk_index: int) -> None:
        if chunk_index < 0:
            raise ValueError(f"chunk_index must be >= 0, got {chunk_index}")
        with self._lock:
            if trajectory_id not in self._by_traj:
                raise KeyError(f"trajectory {trajectory_id!r} is not registered")
            self._by_traj[trajectory_id].chunk_index = chunk_index

    def get(self, trajectory_id: str) -> TrajectoryIdentity:
        with self._lock:
            return self._by_traj[trajectory_id]

    def resolve(
        self,
        credential: str | None,
        claimed_trajectory: str | None = None,
        claimed_bank: str | None = None,
        need_chunk: bool = True,
    ) -> TrajectoryIdentity:
        """Check a request's identity and count every rejection."""
        with self._lock:
            ident = self._by_cred.get(credential or "")
            if ident is None:
                self.rejected["unknown"] += 1
                raise UnknownIdentity(
                    "missing or unknown credential (Authorization: Bearer <trajectory key>)"
                )
            if claimed_trajectory is not None and claimed_trajectory != ident.trajectory_id:
                self.rejected["mismatch"] += 1
                raise IdentityMismatch(
                    f"credential belongs to trajectory {ident.trajectory_id!r}, request claims {claimed_trajectory!r}"
                )
            if claimed_bank is not None and claimed_bank != ident.bank_id:
                self.rejected["mismatch"] += 1
                raise IdentityMismatch(
                    f"credential belongs to bank {ident.bank_id!r}, request claims {claimed_bank!r}"
                )
            if need_chunk and ident.chunk_index < 0:
                self.rejected["no_chunk"] += 1
                raise NoChunkSet(f"trajectory {ident.trajectory_id!r} has no current chunk (set_chunk first)")
            return ident

    def peek_call_index(self, ident: TrajectoryIdentity, chunk_index: int) -> int:
        with self._lock:
            return ident.calls_per_chunk.get(chunk_index, 0)

    def next_call_index(self, ident: TrajectoryIdentity, chunk_index: int) -> int:
        """Call index within the chunk, taken only when a segment is actually recorded (no gaps)."""
        with self._lock:
            n = ident.calls_per_chunk.get(chunk_index, 0)
            ident.calls_per_chunk[chunk_index] = n + 1
            return n
