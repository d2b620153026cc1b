"""Which frameworks exist, their pinned versions, scenes and venvs; the adapter class of each.

The pins here are the single source of truth for `scripts/make_harness_venvs.sh` (it reads
`harnesses/venv_locks/<framework>.txt`, whose top-level pin must equal `distribution==version`)
and for the version check the sandbox does at start-up. Imported by harnesses.registry (which
re-exports it) and harnesses.sandbox; it imports neither, so they do not import each other.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Protocol

from harnesses.base import ConfigurationError, Harness

REPO_ROOT = Path(__file__).resolve().parent.parent


class VenvConfig(Protocol):
    """What `venv_python` reads of a `harnesses.registry.HarnessConfig`."""

    framework: str
    venv_root: str


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


def venv_python(cfg: VenvConfig) -> Path:
    """The interpreter that hosts the framework; 'native' uses the venv this process runs in."""
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
