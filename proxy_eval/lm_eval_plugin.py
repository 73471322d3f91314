"""Lets `lm_eval --model purokit` find proxy_eval's harness model on lm-eval releases whose
registry does not read entry points yet.

purokit declares its model in the `lm_eval.models` entry-point group (pyproject.toml), the group
lm-eval's registry scans for model plugins (lm-eval PR #4013). lm-eval 0.4.13's registry accepts
lazy placeholders but scans no group, so the wheel carries `purokit-lm-eval.pth` (setup.py): at
interpreter start it calls `activate()`, which only puts a finder on `sys.meta_path`; when
`lm_eval.api.registry` is first imported, the group's entry points are registered in it as
"module:object" placeholders, next to the built-in models. Nothing is imported before lm-eval is,
and nothing is done where lm-eval scans the group itself. Standard library only: it runs in every
interpreter of the environment.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as md
import sys
from types import ModuleType
from typing import Any

GROUP = "lm_eval.models"
REGISTRY_MODULE = "lm_eval.api.registry"


def register_entry_points(registry: ModuleType) -> list[str]:
    """Register each `lm_eval.models` entry point the registry does not know yet; the names added.
    The placeholder is the entry point's "module:object", which lm-eval's registry replaces by the
    class when that class registers itself on import (`@register_model`)."""
    if hasattr(registry, "load_plugins"):          # this lm-eval scans plugin groups itself
        return []
    if not hasattr(getattr(registry, "model_registry", None), "register"):
        return []                                  # before lm-eval's lazy Registry (0.4.13): not supported
    # the built-in models first: lm-eval's get_model loads them only into an empty registry
    importlib.import_module("lm_eval.models")

    added = []
    for ep in md.entry_points(group=GROUP):
        if ep.name not in registry.model_registry:
            registry.model_registry.register(ep.name, target=ep.value)
            added.append(ep.name)
    return added


class _ThenRegister(importlib.abc.Loader):
    """The registry module's own loader, then `register_entry_points` on the loaded module."""

    def __init__(self, inner: Any):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_entry_points(module)

    def __getattr__(self, name: str) -> Any:      # get_source, get_filename, ... for inspect and tracebacks
        return getattr(self.inner, name)


class _RegistryWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != REGISTRY_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


def activate() -> None:
    """Watch for lm-eval's registry (idempotent; registers at once if it is already imported)."""
    if REGISTRY_MODULE in sys.modules:
        register_entry_points(sys.modules[REGISTRY_MODULE])
    elif not any(isinstance(f, _RegistryWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryWatcher())
