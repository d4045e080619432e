"""The ``vllm.general_plugins`` entry point: ``vspec = vspec_runtime.plugin:register``.

vLLM calls ``register()`` in every process it starts (API server, engine core, workers), possibly
more than once. It is lazy (imports nothing heavy unless active), re-entrant, and loud once when
active. Inert unless vspec's environment or `vspec enable` says otherwise.
"""

from __future__ import annotations

import logging
import os

from vspec_runtime import envs

logger = logging.getLogger("vspec")

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from vspec_runtime.activation import active_spec

    spec = active_spec()  # raises ActivationError (a clear one-line message) on a bad spec
    if spec is None:
        return
    _registered = True
    _ensure_run_dir()
    _ensure_log_handler()
    from vspec_runtime import metrics, patches

    metrics.register_collector()
    patches.apply_all(spec)  # model registrations and opt-in patches; see vspec_runtime/patches/
    import vllm

    logger.info(
        "vspec active: method=%s policy=%s vllm=%s pid=%d",
        spec.method,
        spec.adaptive.policy if spec.adaptive_active else "off",
        getattr(vllm, "__version__", "?"),
        os.getpid(),
    )


def _ensure_run_dir() -> None:
    """One folder per server for live controller state; children inherit it through the environment."""
    if not envs.get("VSPEC_RUN_DIR"):
        import tempfile

        os.environ["VSPEC_RUN_DIR"] = tempfile.mkdtemp(prefix="vspec-run-")


def _ensure_log_handler() -> None:
    """vLLM configures only its own loggers; give ours a handler so INFO lines reach the server log."""
    vspec_logger = logging.getLogger("vspec")
    if not vspec_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("(vspec pid=%(process)d) %(levelname)s %(asctime)s %(message)s",
                                               datefmt="%m-%d %H:%M:%S"))
        vspec_logger.addHandler(handler)
        vspec_logger.setLevel(logging.INFO)
        vspec_logger.propagate = False
