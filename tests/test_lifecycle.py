"""install / enable / status / upgrade / rollback / uninstall with real pip on wheels built from this repo.

Everything happens in a throwaway virtual environment. `python -m venv --system-site-packages` would
expose the base interpreter's site-packages, not this project's .venv (where vLLM lives), so the
throwaway environment gets a .pth file pointing at a folder of links to .venv's site-packages
without vspec's own files: it sees the installed vLLM, torch and pip, and no vspec until one is
installed. pip runs with --no-deps and no index (PIP_NO_INDEX, PIP_FIND_LINKS at the built wheels):
nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])  # this project's .venv site-packages
RUN_CLI = "import sys; sys.argv[0] = 'vspec'; from vspec_cli.app import main; main()"
_IGNORE = shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", ".vspec-test-cache", "build", "dist",
                                 ".pytest_cache", "bench-out", ".vspec-home")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """vspec 0.1.0 and 0.2.0 wheels built from a copy of this repo (only __version__ differs)."""
    root = tmp_path_factory.mktemp("wheels")
    source = root / "src"
    shutil.copytree(REPO, source, ignore=_IGNORE, symlinks=True)
    out = root / "dist"
    built = {}
    for version in ("0.1.0", "0.2.0"):
        init = source / "vspec_runtime" / "__init__.py"
        text = init.read_text()
        start = text.index('__version__ = "') + len('__version__ = "')
        init.write_text(text[:start] + version + text[text.index('"', start):])
        shutil.rmtree(source / "build", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", "-w", str(out), "."],
                       cwd=source, check=True, capture_output=True, timeout=300)
        built[version] = out / f"vspec-{version}-py3-none-any.whl"
        assert built[version].is_file()
    built["source"] = source  # left at 0.2.0
    return built


@pytest.fixture(scope="module")
def dotvenv_without_vspec(tmp_path_factory) -> Path:
    """Links to everything in .venv's site-packages except vspec's own distribution files."""
    farm = tmp_path_factory.mktemp("site-without-vspec")
    for entry in SITE.iterdir():
        lowered = entry.name.lower()
        if lowered.startswith("vspec") or ("editable" in lowered and "vspec" in lowered):
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


def make_venv(path: Path, pth_line: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_vspec_test_parent.pth").write_text(pth_line + "\n")
    return path


class Env:
    """The throwaway environment and the commands a user would type in it."""

    def __init__(self, venv: Path, wheels: dict[str, Path], home: Path, cwd: Path):
        self.venv, self.home, self.cwd = venv, home, cwd
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VSPEC_SPEC")}
        self.env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels["0.1.0"].parent),
                        PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")

    def vspec(self, *args: str, cwd: Optional[Path] = None, extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
        script = self.venv / "bin" / "vspec"
        argv = [str(script), *args] if script.exists() else [str(self.venv / "bin" / "python"), "-c", RUN_CLI, *args]
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd or self.cwd,
                              env={**self.env, **(extra_env or {})}, timeout=600)

    def pip_version(self) -> Optional[str]:
        shown = subprocess.run([str(self.venv / "bin" / "python"), "-m", "pip", "show", "vspec"], capture_output=True,
                               text=True, env=self.env, cwd=self.cwd, timeout=120)
        for line in shown.stdout.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        return None

    @property
    def state_file(self) -> Path:
        return self.home / "config" / "state.toml"

    def state(self) -> dict:
        return tomllib.loads(self.state_file.read_text())


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    return result


def test_install_enable_upgrade_rollback_uninstall(tmp_path, wheels, dotvenv_without_vspec, isolated_home):
    env = Env(make_venv(tmp_path / "venv", str(dotvenv_without_vspec)), wheels, isolated_home, tmp_path)
    w1, w2 = str(wheels["0.1.0"]), str(wheels["0.2.0"])
    assert env.pip_version() is None

    # A plain `vllm serve` stand-in: it must survive every step and be named as needing a restart.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "vllm").write_text("import time\ntime.sleep(600)\n")
    server = subprocess.Popen([sys.executable, str(fake_bin / "vllm"), "serve", "some-model"])
    try:
        # install from a source checkout (the bootstrap: vspec is not installed yet), then check it
        installed = ok(env.vspec("install", "--wheel", w1, "--no-deps", "--enable", "--yes", cwd=wheels["source"]))
        assert env.pip_version() == "0.1.0"
        assert "vspec doctor:" in installed.stdout and "0 fail" in installed.stdout
        assert "restart needed: running vLLM servers" in installed.stderr and str(server.pid) in installed.stderr
        state = env.state()
        assert state["schema"] == "vspec-state/1" and state["enabled"] is True
        assert (state["installed_version"], state["previous_versions"]) == ("0.1.0", [])
        assert state["installed_source"] == f"wheel:{w1}"

        status = json.loads(ok(env.vspec("status", "--json")).stdout)
        assert status["enabled"] is True and status["environment"]["vspec"]["version"] == "0.1.0"
        assert status["environment"]["other_copies"] == []
        assert server.pid in [s["pid"] for s in status["running_vllm_servers"]]

        # --dry-run changes nothing and says what it would run
        before = env.state_file.read_bytes()
        plan = json.loads(ok(env.vspec("upgrade", "--wheel", w2, "--no-deps", "--dry-run", "--json")).stdout)
        assert plan["dry_run"] is True and plan["to_version"] == "0.2.0"
        assert plan["pip_commands"][0][-3:] == ["--no-cache-dir", "--no-deps", w2]
        assert {"key": "installed_version", "from": "0.1.0", "to": "0.2.0"} in plan["state_changes"]
        assert env.state_file.read_bytes() == before and env.pip_version() == "0.1.0"

        # an upgrade to a missing wheel, or to a broken one, fails and leaves 0.1.0 working
        missing = env.vspec("upgrade", "--wheel", str(tmp_path / "vspec-0.3.0-py3-none-any.whl"), "--no-deps", "--yes")
        assert missing.returncode == 2 and "does not exist" in missing.stderr
        broken = tmp_path / "vspec-0.3.0-py3-none-any.whl"
        broken.write_bytes(b"not a zip file")
        failed = env.vspec("upgrade", "--wheel", str(broken), "--no-deps", "--yes")
        assert failed.returncode == 1 and "pip exited with" in failed.stderr
        assert "nothing changed" in failed.stderr
        assert env.state_file.read_bytes() == before and env.pip_version() == "0.1.0"
        assert ok(env.vspec("--version")).stdout.strip() == "vspec 0.1.0"

        # an upgrade whose doctor check fails is undone: pip succeeded, the old version comes back
        undone = env.vspec("upgrade", "--wheel", w2, "--no-deps", "--yes", extra_env={"VLLM_PLUGINS": "nothing"})
        assert undone.returncode == 1
        assert "vllm loads the vspec plugin" in undone.stderr and "restored vspec 0.1.0" in undone.stderr
        assert env.pip_version() == "0.1.0" and env.state_file.read_bytes() == before

        # upgrade for real (the check was exercised above: install passed it, the undone upgrade failed it)
        ok(env.vspec("upgrade", "--wheel", w2, "--no-deps", "--no-check", "--yes"))
        assert env.pip_version() == "0.2.0"
        assert ok(env.vspec("--version")).stdout.strip() == "vspec 0.2.0"
        state = env.state()
        assert (state["installed_version"], state["previous_versions"], state["enabled"]) == ("0.2.0", ["0.1.0"], True)
        assert [h["action"] for h in state["history"]] == ["install", "upgrade"]

        # rollback with no argument: back to the last recorded version, from its recorded wheel
        ok(env.vspec("rollback", "--no-deps", "--no-check", "--yes"))
        assert env.pip_version() == "0.1.0"
        state = env.state()
        assert (state["installed_version"], state["previous_versions"]) == ("0.1.0", [])
        assert state["installed_source"] == f"wheel:{w1}"
        nothing_left = env.vspec("rollback", "--yes")
        assert nothing_left.returncode == 1 and "no earlier version" in nothing_left.stderr

        # upgrade by version (found through pip's find-links), then rollback --to
        ok(env.vspec("upgrade", "--version", "0.2.0", "--no-deps", "--no-check", "--yes"))
        assert env.pip_version() == "0.2.0" and env.state()["installed_source"] == "index:0.2.0"
        ok(env.vspec("rollback", "--to", "0.1.0", "--no-deps", "--no-check", "--yes"))
        assert env.pip_version() == "0.1.0"
        assert (env.state()["installed_version"], env.state()["previous_versions"]) == ("0.1.0", [])

        # uninstall: dry run first, then for real; vLLM, models and the state file stay
        model = Path(os.environ["VSPEC_MODEL_DIR"]) / "demo" / "config.json"
        model.parent.mkdir(parents=True)
        model.write_text("{}")
        before = env.state_file.read_bytes()
        dry = ok(env.vspec("uninstall", "--dry-run"))
        assert "would run:" in dry.stdout and "uninstall --yes" in dry.stdout and "vspec" in dry.stdout
        assert env.state_file.read_bytes() == before and env.pip_version() == "0.1.0"
        gone = ok(env.vspec("uninstall", "--yes"))
        assert "uninstalled vspec 0.1.0" in gone.stdout and "restart needed" in gone.stderr
        assert env.pip_version() is None
        state = env.state()
        assert state["enabled"] is False and "installed_version" not in state
        assert state["previous_versions"] == ["0.1.0"]
        assert model.is_file()
        still_there = subprocess.run([str(env.venv / "bin" / "python"), "-c", "import vllm, torch; print(vllm.__version__)"],
                                     capture_output=True, text=True, env=env.env, cwd=tmp_path, timeout=300)
        assert still_there.returncode == 0 and still_there.stdout.strip()
        assert server.poll() is None, "vspec must never stop a running vLLM server"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_uninstall_refuses_when_a_parent_environment_still_provides_vspec(tmp_path, isolated_home):
    """Like a --system-site-packages venv whose base has vspec: here the base is this project's .venv."""
    venv = make_venv(tmp_path / "child", f"import site; site.addsitedir({str(SITE)!r})")
    parent_dist = next(SITE.glob("vspec-*.dist-info"))
    result = subprocess.run([str(venv / "bin" / "python"), "-c", RUN_CLI, "uninstall", "--yes"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120,
                            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "refusing to uninstall" in message and str(SITE) in message
    assert parent_dist.is_dir(), "the parent environment's vspec must be untouched"
    assert not (isolated_home / "config" / "state.toml").exists(), "a refused uninstall changes no state"


# --- the state file and the switches (in-process, fast) ---------------------------------------


def test_enable_disable_status_keep_comments_and_what_the_runtime_reads(capsys, isolated_home):
    from cli_helpers import run_cli
    from vspec_runtime import activation, paths

    assert run_cli(capsys, "enable", "--dry-run").exit_code == 0
    assert not paths.state_file().exists(), "--dry-run writes nothing"
    assert run_cli(capsys, "enable").exit_code == 0
    assert activation.enabled_in_state_file()[0] is True

    edited = paths.state_file().read_text() + '\n# tuned for the staging box\n[runtime]\nadaptive = { policy = "online" }  # keep me\n'
    paths.state_file().write_text(edited)
    disabled = run_cli(capsys, "disable", "--json")
    assert json.loads(disabled.stdout)["changed"] is True
    text = paths.state_file().read_text()
    assert "# tuned for the staging box" in text and "# keep me" in text
    assert activation.enabled_in_state_file() == (False, {"adaptive": {"policy": "online"}})
    status = json.loads(run_cli(capsys, "status", "--json").stdout)
    assert status["schema"] == "vspec/status/1" and status["enabled"] is False
    assert [h["action"] for h in tomllib.loads(text)["history"]] == ["enable", "disable"]


def test_a_corrupt_state_file_is_reported_and_left_alone(capsys, isolated_home):
    from cli_helpers import run_cli
    from vspec_runtime import paths

    paths.state_file().parent.mkdir(parents=True)
    paths.state_file().write_text("enabled = tru\n")
    result = run_cli(capsys, "enable")
    assert result.exit_code == 1 and "not valid TOML" in result.stderr and str(paths.state_file()) in result.stderr
    assert paths.state_file().read_text() == "enabled = tru\n"
    paths.state_file().write_text('schema = "vspec-state/9"\nenabled = false\n')
    assert "vspec-state/9" in run_cli(capsys, "status").stderr
