"""Configs, pins and package boundaries of `harnesses`."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harnesses import registry
from harnesses.base import ConfigurationError
from harnesses.registry import FRAMEWORKS, REPO_ROOT, HarnessConfig
from hymem_train.config import ConfigError, to_typed

CONFIGS = sorted((REPO_ROOT / "configs" / "harness").glob("*.yaml"))
LOCKS = sorted((REPO_ROOT / "harnesses" / "venv_locks").glob("*.txt"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_harness_config_validates(path):
    cfg = to_typed(OmegaConf.load(path), HarnessConfig)
    assert cfg.framework in FRAMEWORKS and cfg.scene in FRAMEWORKS[cfg.framework].scenes


def test_hy_memory_has_one_config_per_scene():
    scenes = {
        to_typed(OmegaConf.load(p), HarnessConfig).scene for p in CONFIGS if p.stem.startswith("hy_memory")
    }
    assert scenes == {"chat", "working", "coding"}


def test_bad_config_names_the_key():
    raw = OmegaConf.load(REPO_ROOT / "configs" / "harness" / "native.yaml")
    with pytest.raises(ConfigError, match="native.num_context_memory"):
        to_typed(OmegaConf.merge(raw, {"native": {"num_context_memory": 3}}), HarnessConfig)

    with pytest.raises(ConfigurationError, match="unknown scene 'chat'"):
        to_typed(OmegaConf.merge(raw, {"scene": "chat"}), HarnessConfig)


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.stem)
def test_lock_files_pin_the_registry_version(lock):
    spec = FRAMEWORKS[lock.stem]
    lines = lock.read_text().splitlines()
    assert f"{spec.distribution.lower()}=={spec.version}" in [ln.lower() for ln in lines]
    assert any(ln.startswith("# python: ") for ln in lines)
    # never a CUDA torch: if torch is in the closure it is the local CPU build
    assert all(not ln.startswith("torch==") or ln.endswith("+cpu") for ln in lines)


def test_harnesses_imports_neither_torch_nor_hymem_train():
    code = (
        "import sys, harnesses.base, harnesses.native, harnesses.sandbox, harnesses.registry, "
        "harnesses.callcount, harnesses.tiktoken_seed; "
        "bad = [m for m in ('torch', 'hymem_train') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(REPO_ROOT), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_framework_names_an_adapter_that_exists():
    """Each registered framework points at a real adapter class path (imported only inside its sandbox)."""
    root = Path(registry.__file__).resolve().parent.parent
    for name, spec in FRAMEWORKS.items():
        mod, _, cls = spec.adapter.partition(":")
        assert mod and cls, f"{name}: adapter {spec.adapter!r} is not 'module:Class'"
        src = (root / Path(*mod.split("."))).with_suffix(".py")
        assert src.exists(), f"{name}: {src} missing"
        assert f"class {cls}" in src.read_text(), f"{name}: no class {cls} in {src}"
