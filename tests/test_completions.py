"""The checked-in completions/ scripts are current, match Typer's own, and really complete `vspec`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vspec_cli.commands import completion

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REGENERATE = "run `vspec completions generate` (or `python -m vspec_cli completions generate`) and commit completions/"


def test_checked_in_scripts_regenerate_identically(tmp_path):
    fresh = completion.generate(tmp_path)
    for path in fresh:
        checked_in = REPO / "completions" / path.name
        assert checked_in.is_file(), f"{checked_in} is missing: {REGENERATE}"
        assert checked_in.read_bytes() == path.read_bytes(), f"{checked_in} is stale: {REGENERATE}"


def test_scripts_are_what_vspec_show_completion_prints():
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    for shell, name in completion.SCRIPTS.items():
        shown = subprocess.run([str(BIN / "vspec"), "--show-completion", shell], capture_output=True, text=True,
                               env=env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == (REPO / "completions" / name).read_text()


def _complete(env: dict[str, str]) -> str:
    done = subprocess.run([str(BIN / "vspec")], capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_script_completes_commands_and_model_names():
    script = REPO / "completions" / "vspec.bash"

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        program = (f'source "{script}"; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
                   f'_vspec_completion vspec; printf "%s\\n" "${{COMPREPLY[@]}}"')
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("vspec", "mod") == ["models"]
    assert {"list", "prepare", "verify", "register", "remove"} <= set(complete("vspec", "models", ""))
    assert complete("vspec", "models", "prepare", "qwen2.5-0.5") == ["qwen2.5-0.5b-instruct"]
    assert "--adaptive" in complete("vspec", "doctor", "--")


def test_zsh_and_fish_protocols_answer():
    zsh = _complete({"_VSPEC_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "vspec doc"})
    assert zsh.startswith("_arguments") and '"doctor"' in zsh
    fish = _complete({"_VSPEC_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
                      "_TYPER_COMPLETE_ARGS": "vspec models re"}).splitlines()
    assert sorted(line.split("\t")[0] for line in fish) == ["register", "remove"]


def test_check_mode_reports_a_stale_folder(tmp_path):
    completion.generate(tmp_path)
    (tmp_path / "vspec.fish").write_text("# edited by hand\n")
    assert completion.stale(tmp_path) == ["vspec.fish"]
