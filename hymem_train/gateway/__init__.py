"""OpenAI-compatible gateway: identity-checked, batched, records token-exact Segments.

Names are imported lazily: rollout workers import `hymem_train.gateway.client` only, and must not
pull in torch through the server and engines (a Ray actor per worker would pay for it).
"""

from importlib import import_module

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


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
