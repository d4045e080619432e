"""Run a callback right after a module is imported (or now, if it already is).

Patches target vLLM's worker-side modules (model runner, proposer, rejection sampler). vLLM calls
``register()`` in every process, including the API server, which never imports those modules;
importing them there only to patch them would cost seconds of start-up and import GPU code into a
process that should not touch it. So a patch waits for its module: a meta-path finder wraps the
loader of the named modules only and calls the callbacks once the module body has run, before the
importer sees it. Nothing else is intercepted.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable

Callback = Callable[[ModuleType], None]

_lock = threading.Lock()
_pending: dict[str, list[Callback]] = {}


def when_imported(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported; at once if it already is."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is None:
            _pending.setdefault(module_name, []).append(callback)
            _install_finder()
            return
    callback(module)


def pending() -> dict[str, int]:
    """Module name -> callbacks still waiting (for `vspec doctor` style introspection and tests)."""
    with _lock:
        return {name: len(callbacks) for name, callbacks in _pending.items() if callbacks}


def _install_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _run_callbacks(module_name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(module_name, [])
    for callback in callbacks:
        callback(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or isinstance(spec.loader, _CallbackLoader):
            return spec
        spec.loader = _CallbackLoader(spec.loader, fullname)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    """Delegates everything to the real loader; runs the callbacks after ``exec_module``."""

    def __init__(self, inner: Any, module_name: str) -> None:
        self._inner = inner
        self._module_name = module_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _run_callbacks(self._module_name, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._inner, name)
