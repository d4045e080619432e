"""Run a server in the foreground and make sure it and all its children stop with us."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Optional

GRACE_SECONDS = 20.0  # vLLM shuts its engine and workers down on SIGTERM; give it time, then SIGKILL


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(leader: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM the process group our child ``leader`` leads (started with ``start_new_session``), wait,
    then SIGKILL whatever is left.

    The leader is reaped while we wait: an exited child stays a zombie until its parent waits for it,
    and a zombie keeps its group alive, so without the reaping every stop of a running engine waited
    out the whole grace period (20-30 s) after it had exited.
    """
    pgid = leader.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        leader.poll()
        time.sleep(0.2)
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)


def unwind_on_sigterm() -> None:
    """Make SIGTERM end this process the way Ctrl-C does: by raising in the main thread
    (SystemExit, status 128 + 15), so that every ``finally`` runs.

    vspec's engines and servers run in process groups of their own (``engine_child``, the serve
    driver's servers), stopped by ``finally`` blocks on the way out. Python's default SIGTERM ends the
    process without running them, so `timeout`, `kill` or a CI job's cancel left those groups serving
    on, holding the machine's memory and cores. A second SIGTERM while unwinding is ignored: the
    cleanup has its own SIGKILL deadline, and a signal raised inside it would cut it short.
    """

    def unwind(signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def run_foreground(argv: list[str], env: dict[str, str]) -> int:
    """Start ``argv`` in its own process group; SIGINT/SIGTERM to us stop the group. Returns its status.

    The first signal goes to the server alone: vLLM's API server stops its engine and workers in
    order, rather than racing them down as a group would. (vLLM 0.32 may still log an EngineDeadError
    traceback from its own teardown, vLLM issue #48745: harmless noise, docs/architecture.md.) A
    second signal (an impatient Ctrl-C) goes to the whole group, and whatever is left when the server
    exits is swept either way.
    """
    child = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True)
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        if len(received) == 1:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        else:
            _signal_group(child.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status: Optional[int] = None
        while status is None:
            try:
                status = child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
    finally:
        # vLLM's main process may exit before its engine and workers: sweep the group either way.
        stop_group(child, grace=GRACE_SECONDS if _group_alive(child.pid) else 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        return 0 if status in (0, -signal.SIGTERM, 128 + signal.SIGTERM) else status
    return status
