"""OpenAI-compatible gateway: identity-checked, batched, records token-exact Segments.

Names are imported lazily: rollout workers import `hymem_train.gateway.client` only, and must not
pull in torch through the server and engines (a Ray actor per worker would pay for it).
"""

from hymem_train.lazy import lazy_getattr

_EXPORTS = {
    "Gateway": "server",
    "GatewayConfig": "config",
    "GatewayServer": "runner",
    "IdentityMismatch": "identity",
    "IdentityRegistry": "identity",
    "SegmentStore": "store",
    "UnknownIdentity": "identity",
    "GatewayAdmin": "client",
}


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
