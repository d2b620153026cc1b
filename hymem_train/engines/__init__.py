"""Inference engines behind one interface (base.Engine): HF on CPU, vLLM on GPU.

Names are imported lazily, so `hymem_train.engines.config` (a config schema) costs no torch import.
"""

from hymem_train.lazy import lazy_getattr

_EXPORTS = {
    "Engine": "base",
    "GenerationOutput": "base",
    "PromptTooLongError": "base",
    "SamplingParams": "base",
    "TopKLogprobs": "base",
    "EngineConfig": "config",
    "build_engine": "factory",
}


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
