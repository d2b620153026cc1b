"""OpenAI-compatible gateway: identity-checked, batched, records token-exact Segments."""

from hymem_train.gateway.identity import IdentityMismatch, IdentityRegistry, UnknownIdentity
from hymem_train.gateway.runner import GatewayServer
from hymem_train.gateway.server import Gateway, GatewayConfig
from hymem_train.gateway.store import SegmentStore

__all__ = [
    "Gateway",
    "GatewayConfig",
    "GatewayServer",
    "IdentityMismatch",
    "IdentityRegistry",
    "SegmentStore",
    "UnknownIdentity",
]
