"""HYV3 helpers: presets and parameter counts, the local tokenizer, routing capture/replay.

Names are imported lazily, so `hymem_train.models.config` (a config schema) costs no torch import.
"""

from importlib import import_module

_EXPORTS = {
    "PRESETS": "presets",
    "ParamCounts": "presets",
    "build_model": "presets",
    "count_params": "presets",
    "make_config": "presets",
    "NOT_ROUTED": "routing",
    "RouteRecord": "routing",
    "RoutingController": "routing",
    "RoutingMismatchError": "routing",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
