"""What every patch does the same way: check the upstream symbol, keep the original, apply once.

A patched attribute is a wrapper carrying ``__vspec_patch__`` (the patch name) and
``__vspec_original__`` (what it replaced). Applying the same patch again finds the marker and does
nothing; ``restore`` puts the original back (tests use it). Before touching anything a patch checks
its symbols against ``vspec_runtime.vllm_surface`` (the list `vspec doctor` and the drift test
check too) and raises ``IncompatibleVllm`` naming the symbol and what changed.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from vspec_runtime import vllm_surface

logger = logging.getLogger("vspec.patches")

PATCH_MARK = "__vspec_patch__"
ORIGINAL = "__vspec_original__"


class IncompatibleVllm(RuntimeError):
    """The installed vLLM no longer has what a vspec patch relies on."""


def check_symbols(patch_name: str, targets: tuple[str, ...]) -> None:
    """Raise IncompatibleVllm unless every ``module:Qualified.name`` in ``targets`` is as listed."""
    by_target = {sym.target: sym for sym in vllm_surface.SURFACE}
    for target in targets:
        sym = by_target.get(target)
        if sym is None:  # a vspec bug, not drift: every touched symbol must be listed
            raise RuntimeError(f"vspec patch {patch_name}: {target} is missing from vllm_surface.SURFACE")
        reason = vllm_surface.problem(sym)
        if reason is not None:
            from vspec_runtime import SUPPORTED_VLLM

            raise IncompatibleVllm(
                f"vspec patch '{patch_name}' cannot be applied to this vLLM: {reason}. "
                f"vspec supports vLLM {SUPPORTED_VLLM}; run `vspec doctor` for the full list, "
                f"or turn off the feature that needs this patch."
            )


def is_patched(owner: Any, attribute: str, patch_name: str) -> bool:
    """Whether ``patch_name`` wraps ``owner.attribute``, on top or under another vspec patch
    (two features may wrap the same method, e.g. ``GPUModelRunner._sample``)."""
    current = _own_attribute(owner, attribute)
    while current is not None:
        if getattr(current, PATCH_MARK, None) == patch_name:
            return True
        current = getattr(current, ORIGINAL, None)
    return False


def patch_attribute(owner: Any, attribute: str, patch_name: str,
                    make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``owner.attribute`` by ``make_wrapper(original)``; False when already patched."""
    if is_patched(owner, attribute, patch_name):
        return False
    original = _own_attribute(owner, attribute)
    wrapper = make_wrapper(original)
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, PATCH_MARK, patch_name)
    setattr(wrapper, ORIGINAL, original)
    setattr(owner, attribute, wrapper)
    logger.debug("vspec patch %s applied to %s.%s", patch_name, getattr(owner, "__name__", owner), attribute)
    return True


def original_of(owner: Any, attribute: str) -> Callable[..., Any]:
    current = _own_attribute(owner, attribute)
    return getattr(current, ORIGINAL, current)


def restore(owner: Any, attribute: str) -> bool:
    """Undo the outermost vspec patch on ``owner.attribute``; False when it was not patched."""
    current = _own_attribute(owner, attribute)
    original = getattr(current, ORIGINAL, None)
    if original is None:
        return False
    setattr(owner, attribute, original)
    return True


_said: set[str] = set()  # what first_time() was asked in this process


def first_time(key: str) -> bool:
    """True the first time ``key`` is asked in this process: a patched path logs that it ran ("vspec
    patch NAME live: ...") or warns once, not every step."""
    if key in _said:
        return False
    _said.add(key)
    return True


def _own_attribute(owner: Any, attribute: str) -> Any:
    """The attribute as defined on ``owner`` itself (a class's own dict, not an inherited one)."""
    if isinstance(owner, type):
        if attribute not in owner.__dict__:
            raise IncompatibleVllm(f"{owner.__module__}.{owner.__qualname__} no longer defines {attribute}")
        return owner.__dict__[attribute]
    return getattr(owner, attribute)
