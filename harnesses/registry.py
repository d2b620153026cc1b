"""`HarnessConfig` and `make_harness`; re-exports the framework table of harnesses/frameworks.py.

Which frameworks exist, their pins, scenes and venvs live in harnesses/frameworks.py, which both this
module and the sandbox import (the sandbox needs them, and this module builds sandboxes, so keeping
them here made registry and sandbox import each other).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harnesses.base import ConfigurationError, Endpoint, Harness
from harnesses.frameworks import (
    FRAMEWORKS,
    REPO_ROOT,
    FrameworkSpec,
    get_spec,
    load_adapter_class,
    venv_python,
)
from harnesses.native import NativeConfig, NativeHarness
from harnesses.sandbox import SandboxClient

__all__ = [
    "FRAMEWORKS",
    "REPO_ROOT",
    "FrameworkSpec",
    "HarnessConfig",
    "get_spec",
    "load_adapter_class",
    "make_harness",
    "venv_python",
]


@dataclasses.dataclass
class HarnessConfig:
    framework: str  # native | mem0 | hy_memory | memoryos | everos
    scene: str = "default"  # framework sub-mode; hy_memory: chat | working | coding
    in_process: bool = False  # native only: run in the caller's process (fast tests, embedded default)
    venv_root: str = ".venvs"  # per-framework venvs live in <venv_root>/<framework> (relative to repo root)
    num_retries: int = 1  # platform-error retries per write (bank restored before each; silent failure platform-error-as-reward)
    # copy the bank aside before each write (close, copy, reopen) so a platform error can restore it;
    # off = faster writes, but a failed write leaves the bank unusable (the rollout must drop it)
    snapshot_before_write: bool = True
    rpc_timeout_s: float = 600.0  # one RPC (a whole write) longer than this kills the sandbox: platform error
    start_timeout_s: float = 120.0  # sandbox start-up (framework import) budget
    native: NativeConfig = dataclasses.field(default_factory=NativeConfig)  # native protocol knobs
    options: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # adapter-specific knobs (see docs table)

    def validate(self) -> None:
        get_spec(self.framework, self.scene)
        if self.in_process and self.framework != "native":
            raise ConfigurationError(
                f"harness.in_process: only 'native' runs in-process, not {self.framework!r}"
            )
        if self.num_retries < 0:
            raise ConfigurationError("harness.num_retries must be >= 0")
        if self.num_retries > 0 and not self.snapshot_before_write:
            raise ConfigurationError("harness.num_retries > 0 needs harness.snapshot_before_write=true")


def make_harness(
    cfg: HarnessConfig,
    llm: Endpoint | None,
    embedder: Endpoint | None = None,
    *,
    sandbox_root: str | Path,
    sandbox_id: str,
) -> Harness:
    """The harness the rollout code drives: in-process native, or a sandbox client for the rest.

    `sandbox_root` is the only directory the sandbox may touch; `sandbox_id` is its identity
    (the trajectory id), checked on every RPC (silent failure shared-identity).
    """
    cfg.validate()
    if cfg.in_process:
        return NativeHarness(llm, cfg.native, scene=cfg.scene)
    return SandboxClient(cfg, llm, embedder, sandbox_root=Path(sandbox_root), sandbox_id=sandbox_id)
