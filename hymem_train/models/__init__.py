"""HYV3 helpers: presets and parameter counts, the local tokenizer, routing capture/replay."""

from hymem_train.models.presets import PRESETS, ParamCounts, build_model, count_params, make_config
from hymem_train.models.routing import NOT_ROUTED, RouteRecord, RoutingController, RoutingMismatchError

__all__ = [
    "NOT_ROUTED",
    "PRESETS",
    "ParamCounts",
    "RouteRecord",
    "RoutingController",
    "RoutingMismatchError",
    "build_model",
    "count_params",
    "make_config",
]
