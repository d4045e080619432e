"""One engine child process (``python -m vspec_cli.offline_run ...``) that never outlives its caller.

`vspec bench` and `vspec profile collect` run vLLM in a child process. vLLM starts an engine-core
process and workers of its own, so stopping the child alone can leave them behind holding the
accelerator. The child therefore starts in a session (and process group) of its own, and leaving
``engine_child`` always stops the whole group: SIGTERM, a grace period, then SIGKILL.

The child inherits this process's environment; it sets the spec's device variables itself
(vspec_cli/offline_run.py, ``engine_environment``), the same ones `vspec serve` sets.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vspec_cli.process import GRACE_SECONDS, stop_group


def offline_run_argv(*args: str) -> list[str]:
    """The command line of the engine runner, with this interpreter."""
    return [sys.executable, "-m", "vspec_cli.offline_run", *args]


@contextmanager
def engine_child(args: list[str], grace: float = GRACE_SECONDS, **popen_kwargs: Any) -> Iterator[subprocess.Popen]:
    """Start ``offline_run`` with ``args`` (``popen_kwargs`` go to Popen: pipes, log file, text mode).

    On the way out, whether the child finished, failed or we were interrupted, the child's process
    group is stopped: with ``grace`` seconds to shut down if the child still runs, at once otherwise
    (to sweep engine processes that outlived it); then the child is reaped.
    """
    child = subprocess.Popen(offline_run_argv(*args), start_new_session=True, **popen_kwargs)
    try:
        yield child
    finally:
        stop_group(child, grace=grace if child.poll() is None else 0)
        child.wait()
