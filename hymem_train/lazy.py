"""Lazy package exports (PEP 562): a package lists `name -> submodule` and imports the submodule on
first use, so importing a light submodule (a config schema, the gateway client) never pays for the
heavy ones (torch, fastapi)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
