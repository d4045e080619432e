"""engine_child stops the child's whole process group: vLLM's engine-core and workers must not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vspec_cli import engine_child as engine_child_module
from vspec_cli.engine_child import engine_child, offline_run_argv
from vspec_cli.process import stop_group

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


def test_stopping_a_running_child_does_not_wait_out_the_grace_period():
    """The child exits on SIGTERM at once; an unreaped child is a zombie that keeps its group alive,
    so stop_group must reap it while it waits, or every engine stop costs the whole grace (20-30 s)."""
    grace = 20.0
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(120)"],
                             start_new_session=True, stdout=subprocess.PIPE)
    child.stdout.readline()  # running, its SIGTERM disposition the default
    started = time.monotonic()
    stop_group(child, grace=grace)
    assert time.monotonic() - started < grace, "stop_group waited out the grace on an exited child"
    assert child.returncode == -signal.SIGTERM
    child.stdout.close()


# `vspec bench` as a user runs it, with the engine runner swapped for PARENT_WITH_WORKER (vLLM's process
# shape without its minute of start-up: what is tested is who stops the group, not the engine); the
# stand-in writes its worker's pid to a file, because the bench reads the child's stdout itself.
BENCH_WITH_STAND_IN = """
import sys
from vspec_cli import engine_child
stand_in = {stand_in!r}.replace("print(worker.pid, flush=True)", "open({pid_file!r}, 'w').write(str(worker.pid))")
engine_child.offline_run_argv = lambda *args: [sys.executable, "-c", stand_in]
sys.argv = ["vspec", *{argv!r}]
from vspec_cli.app import main
main()
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_sigterm_to_vspec_bench_stops_its_engine_group(tmp_path, demo_model_dir):
    """`timeout`, `kill` or a CI cancel sends SIGTERM to vspec alone; the engine's group, in a session of
    its own, must stop with it (Python's default SIGTERM skipped the cleanup and left it running)."""
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "Count: 1 2 3"}\n')
    pid_file = tmp_path / "worker.pid"
    argv = ["bench", "--target-model", str(demo_model_dir), "--method", "ngram", "--gamma", "2",
            "--policies", "target-only,online", "--workload", str(prompts), "--batch", "1", "--rounds", "1",
            "--repeats", "1", "--out", str(tmp_path / "bench")]
    script = BENCH_WITH_STAND_IN.format(stand_in=PARENT_WITH_WORKER, pid_file=str(pid_file), argv=argv)
    vspec = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert vspec.poll() is None, vspec.communicate()[1][-3000:]
            time.sleep(0.2)
        worker_pid = int(pid_file.read_text())
        assert running(worker_pid)
        vspec.send_signal(signal.SIGTERM)
        _, stderr = vspec.communicate(timeout=30)
    finally:
        if vspec.poll() is None:
            vspec.kill()
    try:
        assert vspec.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert stopped_within(worker_pid, 5), "the engine's worker outlived vspec bench"
    finally:
        if running(worker_pid):  # a failure here must not leave the stand-ins behind
            os.killpg(os.getpgid(worker_pid), signal.SIGKILL)
