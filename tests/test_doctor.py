"""`vspec doctor`: passes on this machine's vLLM, fails (exit 1) naming a symbol a stand-in vLLM lacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

from cli_helpers import run_cli
from vspec_cli import doctor_checks
from vspec_runtime import TESTED_VLLM
from vspec_runtime.vllm_surface import SURFACE

REPO = Path(__file__).resolve().parents[1]
HIDDEN = "vllm.v1.core.sched.output.SchedulerOutput.num_spec_tokens_to_schedule"

# The stand-in's plugin loader behaves like vLLM's: load each entry point, log and skip failures.
_PLUGINS_BODY = '''
import logging
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)
DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"


def load_plugins_by_group(group):
    plugins = {}
    for plugin in entry_points(group=group):
        try:
            plugins[plugin.name] = plugin.load()
        except Exception:
            logger.exception("Failed to load plugin %s", plugin.name)
    return plugins


def load_general_plugins():
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
'''


def build_standin_vllm(root: Path, version: str = TESTED_VLLM, hidden: Optional[str] = None) -> Path:
    """A tiny `vllm` package generated from SURFACE, so it tracks the list as it grows."""
    modules: dict[str, dict] = defaultdict(lambda: {"functions": {}, "classes": defaultdict(
        lambda: {"init": (), "methods": {}, "fields": [], "attributes": []})})
    for sym in SURFACE:
        if sym.kind == "entry-point-group":
            continue
        module_name, _, qualname = sym.target.partition(":")
        parts = qualname.split(".")
        module = modules[module_name]
        params = tuple(sym.params or ())
        if sym.kind == "class":
            module["classes"][parts[0]]["init"] = params
            continue
        if len(parts) == 1:
            if sym.name != hidden:
                module["functions"][parts[0]] = params
            continue
        owner = module["classes"][parts[0]]  # created even when its member is hidden
        if sym.name == hidden:
            continue
        if sym.kind == "function":
            owner["methods"][parts[1]] = params
        elif sym.kind == "field":
            owner["fields"].append(parts[1])
        else:
            owner["attributes"].append(parts[1])

    package = root / "vllm"
    for module_name, content in modules.items():
        path = root.joinpath(*module_name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["import dataclasses", ""]
        # A module that other listed modules live under (vllm.plugins, vllm.model_executor.models)
        # must be a package, or its submodules would hide it.
        if module_name == "vllm.plugins" or any(other.startswith(module_name + ".") for other in modules):
            path = path.with_suffix("") / "__init__.py"
            path.parent.mkdir(parents=True, exist_ok=True)
        if module_name == "vllm.plugins":
            lines.append(_PLUGINS_BODY)
        for name, params in content["functions"].items():
            if module_name != "vllm.plugins":
                lines.append(f"def {name}({', '.join([*params, '*args', '**kwargs'])}):\n    return None\n")
        for name, cls in content["classes"].items():
            if cls["fields"]:
                lines.append("@dataclasses.dataclass")
            lines.append(f"class {name}:")
            lines.extend(f"    {field}: int = 0" for field in cls["fields"])
            if not cls["fields"] or cls["init"] or cls["attributes"]:
                args = ", ".join(["self", *cls["init"], "*args", "**kwargs"])
                body = [f"        self.{attr} = None" for attr in cls["attributes"]] or ["        pass"]
                lines.extend([f"    def __init__({args}):", *body])
            for method, params in cls["methods"].items():
                lines.append(f"    def {method}({', '.join(['self', *params, '*args', '**kwargs'])}):\n        return None")
            lines.append("")
        path.write_text("\n".join(lines) + "\n")
    for folder in [package, *package.rglob("*")]:
        if folder.is_dir() and not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    return root


def run_doctor_in(python_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(python_path)}
    env.pop("VSPEC_SPEC", None)
    return subprocess.run([sys.executable, "-c", "from vspec_cli.app import main; main()", "doctor", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_doctor_passes_on_this_machine(capsys):
    result = run_cli(capsys, "doctor", "--json")
    report = json.loads(result.stdout)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0, failed
    assert report["schema"] == "vspec/doctor/1" and report["ok"] is True
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert all(statuses[sym.name] == "ok" for sym in SURFACE)
    plugin = next(c for c in report["checks"] if c["name"] == "vllm loads the vspec plugin")
    assert plugin["status"] == "ok" and "vspec" in plugin["reason"]
    env = report["environment"]
    assert env["vllm"]["version"] == TESTED_VLLM and statuses["vllm version"] == "ok"
    assert env["platform"] == "cpu" and env["torch"]
    assert doctor_checks.CPU_CORES_CHECK in statuses
    assert env["python"]["version"] == ".".join(map(str, sys.version_info[:3]))


def test_doctor_runs_the_sampling_check_on_the_real_cpu_kernel():
    """vLLM 0.32's CPU expand kernel drops float outputs; doctor runs it and vspec's fix, and says so."""
    check = doctor_checks.sampling_check()
    assert check.name == doctor_checks.SAMPLING_CHECK and check.status == "ok", check.reason
    assert "drops float outputs" in check.reason and "fixes it" in check.reason


def test_doctor_says_how_many_cores_the_model_gets_on_cpu():
    """On a 2-core host vLLM would keep one core from the model; doctor says vspec gives it both, warns
    when the user's own reserve halves a small host, and leaves bigger hosts to vLLM."""
    small = doctor_checks.cpu_cores_check(cpus=2, environ={})
    assert small.status == "ok" and "runs on 2 of 2" in small.reason and "vspec" in small.reason
    halved = doctor_checks.cpu_cores_check(cpus=2, environ={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})
    assert halved.status == "warn" and "runs on 1 of 2" in halved.reason and "unset" in halved.reason
    big = doctor_checks.cpu_cores_check(cpus=16, environ={})
    assert big.status == "ok" and "runs on 15 of 16" in big.reason and "vLLM keeps one" in big.reason
    typo = doctor_checks.cpu_cores_check(cpus=2, environ={"VLLM_CPU_NUM_OF_RESERVED_CPU": "one"})
    assert typo.status == "warn" and "not a whole number" in typo.reason


def test_method_and_adaptive_choose_the_symbols_that_matter():
    eagle = {s.name for s in SURFACE if s.matters_for("eagle", False)}
    adaptive_draft = {s.name for s in SURFACE if s.matters_for("draft", True)}
    assert "vllm.model_executor.models.ModelRegistry.register_model" in eagle
    assert "vllm.v1.core.sched.scheduler.Scheduler.dynamic_sd_lookup" not in eagle
    assert "vllm.v1.core.sched.scheduler.Scheduler.dynamic_sd_lookup" in adaptive_draft
    assert "vllm.model_executor.models.ModelRegistry.register_model" not in adaptive_draft
    assert "vllm.plugins.load_general_plugins" in eagle & adaptive_draft
    assert all(s.matters_for(None, False) for s in SURFACE)
    # EAGLE-3 heads with a reduced draft vocabulary: vLLM's own head class and the target's aux layers
    eagle3 = {s.name for s in SURFACE if s.matters_for("eagle3", False)}
    reduced_vocab = "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM.draft_id_to_target_id"
    assert reduced_vocab in eagle3 and reduced_vocab not in eagle
    assert "vllm.model_executor.models.llama.LlamaForCausalLM.set_aux_hidden_state_layers" in eagle3


def test_a_standin_vllm_missing_one_symbol_fails_naming_it(tmp_path):
    root = build_standin_vllm(tmp_path / "standin", hidden=HIDDEN)
    git = shutil.which("git")
    if git:  # the stand-in is also a dirty source checkout: doctor reports its revision
        quiet = {"capture_output": True, "check": True, "cwd": root}
        subprocess.run([git, "init", "-q"], **quiet)
        subprocess.run([git, "add", "-A"], **quiet)
        subprocess.run([git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "stand-in"], **quiet)
        (root / "vllm" / "__init__.py").write_text(f'__version__ = "{TESTED_VLLM}"\n# local edit\n')

    result = run_doctor_in(root, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    failed = {c["name"]: c["reason"] for c in report["checks"] if c["status"] == "fail"}
    assert list(failed) == [HIDDEN]
    assert "no field 'num_spec_tokens_to_schedule'" in failed[HIDDEN]
    assert report["environment"]["vllm"]["location"] == str(root / "vllm")
    if git:
        assert report["environment"]["vllm"]["dirty"] is True
        assert len(report["environment"]["vllm"]["git_revision"]) == 40

    narrowed = run_doctor_in(root, "--method", "ngram")  # the table people read
    assert narrowed.returncode == 0, "ngram without --adaptive does not need the per-step K field"
    assert "Scheduler" not in narrowed.stdout and "ModelRegistry" not in narrowed.stdout
    assert "vllm loads the vspec plugin" in narrowed.stdout and "0 fail" in narrowed.stdout


def test_another_vllm_version_warns_but_passes(tmp_path):
    root = build_standin_vllm(tmp_path / "standin", version="0.33.1")
    result = run_doctor_in(root, "--json")
    assert result.returncode == 0, result.stdout[-3000:]
    check = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "vllm version")
    assert check["status"] == "warn"
    assert "0.33.1 differs from the tested" in check["reason"] and "OUTSIDE the supported range" in check["reason"]


def test_a_plugin_that_fails_to_import_is_caught_through_real_vllm(tmp_path, monkeypatch):
    """vLLM logs and skips a plugin whose import fails; doctor must turn that into a fail with the cause."""
    broken = tmp_path / "broken" / "vspec_runtime"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "plugin.py").write_text("raise RuntimeError('plugin import exploded')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    monkeypatch.chdir(tmp_path)  # not the repo: the stand-in must be what vLLM imports
    check = doctor_checks.finish_plugin_probe(doctor_checks.start_plugin_probe())
    assert check.status == "fail"
    assert "RuntimeError: plugin import exploded" in check.reason
