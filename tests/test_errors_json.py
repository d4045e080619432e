"""Failures under `--json`: one vspec/error/1 object on stdout, the human message still on stderr."""

from __future__ import annotations

import json
import subprocess

import pytest

from cli_helpers import run_cli
from vspec_cli import _errors

UNKNOWN_PRESET = ("serve", "no-such-preset", "--dry-run")
BAD_GAMMA = ("serve", "demo", "--dry-run", "--gamma", "abc")


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("VSPEC_DEBUG", raising=False)


def error_of(stdout: str) -> dict:
    document = json.loads(stdout)
    assert document["schema"] == "vspec/error/1"
    return document["error"]


def test_bad_input_under_json_is_one_error_object(capsys):
    result = run_cli(capsys, *UNKNOWN_PRESET, "--json")
    assert result.exit_code == 2
    error = error_of(result.stdout)
    assert error["code"] == "bad-input" and error["exit_code"] == 2
    assert "unknown preset 'no-such-preset'" in error["message"]
    assert "--list-presets" in error["hint"]
    assert "Error:" in result.stderr and "unknown preset" in result.stderr


def test_without_json_stdout_stays_empty(capsys):
    result = run_cli(capsys, *UNKNOWN_PRESET)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Error:" in result.stderr


def test_json_after_double_dash_belongs_to_vllm(capsys):
    result = run_cli(capsys, *UNKNOWN_PRESET, "--", "--json")
    assert result.exit_code == 2 and result.stdout == ""


def test_a_missing_hint_is_null(capsys):
    result = run_cli(capsys, "doctor", "--method", "magic", "--json")
    assert result.exit_code == 2
    error = error_of(result.stdout)
    assert error["code"] == "bad-input" and error["hint"] is None


def test_usage_error_under_json_keeps_typers_message(capsys):
    result = run_cli(capsys, *BAD_GAMMA, "--json")
    assert result.exit_code == 2
    error = error_of(result.stdout)
    assert error["code"] == "usage" and error["exit_code"] == 2
    assert "--gamma" in error["message"]
    assert error["hint"].endswith("serve -h")  # the program name is pytest's here, `vspec` for real
    assert "Usage:" in result.stderr and "--gamma" in result.stderr


def test_usage_error_without_json_prints_nothing_on_stdout(capsys):
    result = run_cli(capsys, *BAD_GAMMA)
    assert result.exit_code == 2
    assert result.stdout == "" and "Usage:" in result.stderr


def test_help_under_json_is_not_an_error(capsys):
    result = run_cli(capsys, "serve", "--json", "--help")
    assert result.exit_code == 0 and "vspec/error" not in result.stdout


def test_unexpected_exception_still_raises_and_reports_internal(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("vspec_cli.commands.serve.resolve_spec", broken)
    with pytest.raises(RuntimeError, match="boom"):
        run_cli(capsys, "serve", "demo", "--dry-run", "--json")
    error = error_of(capsys.readouterr().out)
    assert error == {"code": "internal", "message": "RuntimeError: boom", "hint": None, "exit_code": 1}


def test_debug_flag_is_read_through_envs_and_reraises(capsys, monkeypatch):
    monkeypatch.setenv("VSPEC_DEBUG", "on")  # a value only envs' flag parser accepts
    with pytest.raises(_errors.UserInputError):
        run_cli(capsys, *UNKNOWN_PRESET, "--json")
    error = error_of(capsys.readouterr().out)
    assert error["code"] == "bad-input" and error["exit_code"] == 1  # the traceback ends the process with 1


def test_error_classes_live_in_one_module_and_stay_importable():
    from vspec_cli.lifecycle import LifecycleFailed
    from vspec_cli.profiling.collect import EngineRunError

    assert LifecycleFailed is _errors.LifecycleFailed and LifecycleFailed.__module__ == "vspec_cli._errors"
    assert EngineRunError is _errors.EngineRunError and EngineRunError.__module__ == "vspec_cli._errors"


def test_post_check_reads_doctors_error_object(monkeypatch):
    from vspec_cli import lifecycle

    stdout = json.dumps({"schema": "vspec/error/1", "error": {"code": "internal", "message": "ImportError: nope",
                                                              "hint": None, "exit_code": 1}})
    monkeypatch.setattr(lifecycle.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout=stdout, stderr="Traceback ..."))
    with pytest.raises(_errors.LifecycleFailed, match="did not run in the new installation: ImportError: nope"):
        lifecycle._post_check("0.1.0")
