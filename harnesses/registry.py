"""Which frameworks exist, their pinned versions, scenes and venvs; `HarnessConfig`; `make_harness`.

The pins here are the single source of truth for `scripts/make_harness_venvs.sh` (it reads
`harnesses/venv_locks/<framework>.txt`, whose top-level pin must equal `distribution==version`)
and for the version check the sandbox does at start-up.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from harnesses.base import ConfigurationError, Endpoint, Harness
from harnesses.native import NativeConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class FrameworkSpec:
    name: str  # registry name used in configs and bank.json
    distribution: str  # PyPI distribution installed in the venv
    version: str  # exact pin
    scenes: tuple[str, ...]  # accepted scene names
    adapter: str  # "module:Class" imported inside the sandbox only; "" = not implemented yet
    python: str  # interpreter used to create the venv
    held_out: bool = False  # evaluation only (EverOS); never used for training rollouts


FRAMEWORKS: dict[str, FrameworkSpec] = {
    spec.name: spec
    for spec in (
        FrameworkSpec(
            "native", "hymem-train", "0.1.0", ("default",), "harnesses.native:NativeHarness", "python3.11"
        ),
        FrameworkSpec(
            "mem0", "mem0ai", "2.2.1", ("default",), "harnesses.adapters.mem0:Mem0Harness", "python3.11"
        ),
        FrameworkSpec(
            "hy_memory",
            "hy-memory",
            "2.0.6",
            ("chat", "working", "coding"),
            "harnesses.adapters.hy_memory:HyMemoryHarness",
            "python3.11",
        ),
        FrameworkSpec(
            "memoryos",
            "MemoryOS",
            "2.0.33",
            ("general_text",),
            "harnesses.adapters.memoryos:MemosHarness",
            "python3.11",
        ),
        FrameworkSpec(
            "everos",
            "EverOS",
            "1.5.1",
            ("default",),
            "harnesses.adapters.everos:EverOSHarness",
            "/root/.pyenv/versions/3.12.1/bin/python",
            held_out=True,
        ),
    )
}


def get_spec(framework: str, scene: str) -> FrameworkSpec:
    spec = FRAMEWORKS.get(framework)
    if spec is None:
        raise ConfigurationError(
            f"unknown harness framework {framework!r}; known: {', '.join(sorted(FRAMEWORKS))}"
        )
    if scene not in spec.scenes:
        raise ConfigurationError(
            f"harness {framework!r}: unknown scene {scene!r}; known: {', '.join(spec.scenes)}"
        )
    if not spec.adapter:
        raise ConfigurationError(
            f"harness {framework!r} ({spec.distribution} {spec.version}): no adapter yet in harnesses/adapters/"
        )
    return spec


@dataclasses.dataclass
class HarnessConfig:
    framework: str  # native | mem0 | hy_memory | memoryos | everos
    scene: str = "default"  # framework sub-mode; hy_memory: chat | working | coding
    in_process: bool = False  # native only: run in the caller's process (fast tests, embedded default)
    venv_root: str = ".venvs"  # per-framework venvs live in <venv_root>/<framework> (relative to repo root)
    num_retries: int = 1  # platform-error retries per write (bank restored before each; silent failure 7)
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


def venv_python(cfg: HarnessConfig) -> Path:
    """The interpreter that hosts the framework; 'native' uses the venv this process runs in."""
    import sys

    if cfg.framework == "native":
        return Path(sys.executable)
    root = Path(cfg.venv_root)
    if not root.is_absolute():
        root = REPO_ROOT / root
    py = root / cfg.framework / "bin" / "python"
    if not py.exists():
        raise ConfigurationError(
            f"harness {cfg.framework!r}: venv missing ({py} not found); create it with "
            f"`scripts/make_harness_venvs.sh {cfg.framework}`"
        )
    return py


def load_adapter_class(framework: str) -> type[Harness]:
    """Import the adapter (inside the sandbox process: this imports the framework)."""
    spec = FRAMEWORKS[framework]
    mod_name, cls_name = spec.adapter.split(":")
    return getattr(importlib.import_module(mod_name), cls_name)


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
    (the trajectory id), checked on every RPC (silent failure 8).
    """
    cfg.validate()
    if cfg.in_process:
        from harnesses.native import NativeHarness

        return NativeHarness(llm, cfg.native, scene=cfg.scene)
    from harnesses.sandbox import SandboxClient

    return SandboxClient(cfg, llm, embedder, sandbox_root=Path(sandbox_root), sandbox_id=sandbox_id)
