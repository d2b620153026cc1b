"""Inference engines behind one interface (base.Engine): HF on CPU, vLLM on GPU.

Names are imported lazily, so `hymem_train.engines.config` (a config schema) costs no torch import.
"""

from importlib import import_module

_EXPORTS = {
    "Engine": "base",
    "GenerationOutput": "base",
    "PromptTooLongError": "base",
    "SamplingParams": "base",
    "TopKLogprobs": "base",
    "EngineConfig": "config",
    "build_engine": "factory",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
