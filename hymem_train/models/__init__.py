"""HYV3 helpers: presets and parameter counts, the local tokenizer, routing capture/replay.

Names are imported lazily, so `hymem_train.models.config` (a config schema) costs no torch import.
"""

from hymem_train.lazy import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
