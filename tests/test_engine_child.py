"""engine_child stops the child's whole process group: vLLM's engine-core and workers must not outlive it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vspec_cli import engine_child as engine_child_module
from vspec_cli.engine_child import engine_child, offline_run_argv

# Stands in for offline_run: starts a worker (in the same process group, as vLLM's engine core is), prints
# the worker's pid, then waits.
PARENT_WITH_WORKER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(worker.pid, flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    """Not gone and not a zombie (an orphan may wait for its reaper a moment)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def stopped_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.1)
    return not running(pid)


@pytest.fixture
def fake_runner(monkeypatch):
    monkeypatch.setattr(engine_child_module, "offline_run_argv", lambda *args: [sys.executable, "-c", PARENT_WITH_WORKER])


def test_the_argv_runs_offline_run_with_this_interpreter():
    assert offline_run_argv("--progress", "a.json", "b.json") == [
        sys.executable, "-m", "vspec_cli.offline_run", "--progress", "a.json", "b.json"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_leaving_stops_the_child_and_its_workers(fake_runner):
    with engine_child([], grace=1, stdout=subprocess.PIPE, text=True) as child:
        worker_pid = int(child.stdout.readline())
        assert os.getpgid(worker_pid) == child.pid  # the child leads a group of its own
    child.stdout.close()
    assert child.returncode is not None
    assert stopped_within(worker_pid, 5)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_an_error_inside_still_stops_the_group(fake_runner):
    with pytest.raises(RuntimeError, match="interrupted"):
        with engine_child([], grace=1, stdout=subprocess.PIPE, text=True) as child:
            worker_pid = int(child.stdout.readline())
            raise RuntimeError("interrupted")
    child.stdout.close()
    assert child.returncode is not None
    assert stopped_within(worker_pid, 5)
