"""The vllm.general_plugins entry point: inert unless vspec is active, loud once, fails fast on a bad spec."""

import os
import subprocess
import sys

from conftest import REPO

CALL_TWICE = "from vspec_runtime.plugin import register; register(); register(); print('returned')"


def run_register(env_overrides: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VSPEC_SPEC")}
    env.update(env_overrides)
    return subprocess.run([sys.executable, "-c", CALL_TWICE], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def test_inert_without_vspec_environment(isolated_home):
    result = run_register({"VSPEC_HOME": str(isolated_home)})
    assert result.returncode == 0 and "returned" in result.stdout
    assert "vspec active" not in result.stderr


def test_active_with_a_spec_logs_one_line(isolated_home):
    spec = '{"target_model": "demo", "method": "ngram", "adaptive": {"enabled": true}}'
    result = run_register({"VSPEC_HOME": str(isolated_home), "VSPEC_SPEC": spec})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("vspec active: method=ngram policy=online") == 1


def test_bad_spec_fails_fast_with_a_clear_message(isolated_home):
    result = run_register({"VSPEC_HOME": str(isolated_home), "VSPEC_SPEC": '{"target_model": "x", "gamma": 99}'})
    assert result.returncode != 0
    assert "VSPEC_SPEC is invalid: gamma: got 99" in result.stderr
