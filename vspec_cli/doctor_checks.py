"""The checks behind `vspec doctor`: versions, platform, every vLLM symbol vspec relies on, a real plugin load.

``run_doctor`` returns a Report, a list of checks, each ok/warn/fail with a one-line reason; the
command (vspec_cli/commands/doctor.py) renders it and exits 1 on any fail. The vLLM symbols come
from vspec_runtime/vllm_surface.py. ``preset_scope`` turns a preset into what it would run: the
symbols for its method and adaptive settings, and one check per extension it enables
(vspec_runtime/patches REGISTRY), ok when every symbol that extension relies on is. vLLM logs and
skips a plugin that fails to import, so the plugin check runs vLLM's own loader in a fresh process
(VSPEC_SPEC unset) and looks for "vspec".
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from vspec_cli.parallel_layout import cpu_cores, runs_on_cpu
from vspec_runtime import SUPPORTED_VLLM, TESTED_VLLM, __version__, vllm_surface

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "vspec"
PLUGIN_PROBE_TIMEOUT_S = 300
_RESULT_MARK = "VSPEC_DOCTOR_LOADED="

# `python -c` puts the working directory first on sys.path; drop it so a source tree that happens to
# be the cwd cannot stand in for what is installed.
_PLUGIN_PROBE = f"""
import sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import json
from vllm.plugins import load_plugins_by_group
loaded = load_plugins_by_group({PLUGIN_GROUP!r})
print({_RESULT_MARK!r} + json.dumps(sorted(loaded)), flush=True)
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    reason: str
    kind: str = "environment"  # environment | vllm-symbol | extension | plugin | parallel


@dataclass
class Report:
    environment: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    parallel: Optional[dict[str, Any]] = None  # the layout a preset would run (parallel_scope)

    @property
    def failed(self) -> bool:
        return any(check.status == "fail" for check in self.checks)

    def summary(self) -> dict[str, int]:
        return {status: sum(c.status == status for c in self.checks) for status in ("ok", "warn", "fail")}

    def as_dict(self) -> dict:
        return {"ok": not self.failed, "summary": self.summary(), "environment": self.environment,
                "checks": [asdict(check) for check in self.checks],
                **({"parallel": self.parallel} if self.parallel is not None else {})}

    def add_parallel(self, parallel: dict[str, Any]) -> None:
        """The layout section, and one check: fail with vLLM's reason when the layout cannot start."""
        self.parallel = parallel
        problems = parallel["problems"]
        reason = "; ".join(problems) if problems else (
            f"{parallel['describe']}, K agreement {parallel['k_agreement']} (see the \"parallel\" section of --json)")
        self.checks.append(Check("parallel layout", "fail" if problems else "ok", reason, "parallel"))


# --- environment ------------------------------------------------------------------------------


def _dist_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_state(folder: Path) -> Optional[dict]:
    """Revision and dirty flag of the git checkout containing ``folder`` (a vLLM source tree)."""
    git = shutil.which("git")
    if git is None or not (folder / ".git").exists():
        return None

    def run(*args: str) -> Optional[str]:
        done = subprocess.run([git, "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else None

    revision = run("rev-parse", "HEAD")
    if revision is None:
        return None
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"source_tree": str(folder), "git_revision": revision, "dirty": bool(status)}


def vllm_info(import_module: Callable[[str], Any] = importlib.import_module) -> dict[str, Any]:
    try:
        vllm = import_module("vllm")
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}
    location = Path(getattr(vllm, "__file__", "") or ".").resolve().parent
    info: dict[str, Any] = {"installed": True, "version": str(getattr(vllm, "__version__", "unknown")),
                            "location": str(location)}
    git = _git_state(location.parent)
    if git:
        info.update(git)
    return info


def detect_platform() -> dict[str, Any]:
    """cpu, cuda or ascend, with the accelerator stack's versions where present."""
    info: dict[str, Any] = {"torch": _dist_version("torch")}
    for dist in ("vllm-ascend", "torch-npu"):
        version = _dist_version(dist)
        if version:
            info[dist] = version
    if importlib.util.find_spec("torch_npu") is not None:
        info["platform"] = "ascend"
    elif info["torch"] is None:
        info["platform"] = "unknown (torch is not installed)"
    else:
        import torch

        info["platform"] = "cuda" if torch.cuda.is_available() else "cpu"
        if info["platform"] == "cuda":
            info["cuda"] = torch.version.cuda
            info["devices"] = torch.cuda.device_count()
    return info


def _vspec_locations() -> list[str]:
    found = []
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower() == "vspec":
            found.append(f"{dist.version} at {Path(str(dist.locate_file(''))).resolve()}")
    return found


# --- checks -----------------------------------------------------------------------------------


def _version_check(version: str) -> Check:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version == TESTED_VLLM:
        return Check("vllm version", "ok", f"{version} is the tested version")
    try:
        inside = Version(version) in SpecifierSet(SUPPORTED_VLLM)
    except InvalidVersion:
        inside = False
    where = f"inside the supported range {SUPPORTED_VLLM}" if inside else f"OUTSIDE the supported range {SUPPORTED_VLLM}"
    return Check("vllm version", "warn", f"{version} differs from the tested {TESTED_VLLM} ({where}); the symbol checks below decide")


def start_plugin_probe() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "VSPEC_SPEC"}
    return subprocess.Popen([sys.executable, "-c", _PLUGIN_PROBE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish_plugin_probe(probe: subprocess.Popen) -> Check:
    try:
        output, _ = probe.communicate(timeout=PLUGIN_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return Check("vllm loads the vspec plugin", "fail", f"vLLM's plugin loader did not finish in {PLUGIN_PROBE_TIMEOUT_S} s", "plugin")
    loaded = None
    for line in output.splitlines():
        if line.startswith(_RESULT_MARK):
            loaded = json.loads(line[len(_RESULT_MARK):])
    if loaded is None:
        return Check("vllm loads the vspec plugin", "fail",
                     f"vLLM's plugin loader crashed: {_last_error(output) or f'exit {probe.returncode}'}", "plugin")
    if PLUGIN_NAME in loaded:
        return Check("vllm loads the vspec plugin", "ok", f"{PLUGIN_GROUP} loaded {', '.join(loaded)}", "plugin")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        reason = f"VLLM_PLUGINS={allowed!r} does not include '{PLUGIN_NAME}'"
    else:
        reason = _last_error(output.split(f"Failed to load plugin {PLUGIN_NAME}", 1)[-1]) if \
            f"Failed to load plugin {PLUGIN_NAME}" in output else "no 'vspec' entry point was found"
    return Check("vllm loads the vspec plugin", "fail", f"vLLM skipped it: {reason}", "plugin")


def _last_error(text: str) -> Optional[str]:
    """The exception line of the last traceback in ``text``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) or head in ("KeyboardInterrupt", "SystemExit"):
            return line
    return lines[-1] if lines else None


def _entry_point_check() -> Check:
    points = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not points:
        return Check("vspec entry point", "fail",
                     f"no '{PLUGIN_NAME}' entry point in {PLUGIN_GROUP}: vspec is not installed in this environment "
                     "(run `pip install -e .` or `vspec install`)", "plugin")
    return Check("vspec entry point", "ok", f"{PLUGIN_GROUP}: {PLUGIN_NAME} = {points[0].value}", "plugin")


def _state_check() -> Check:
    from vspec_cli import state
    from vspec_cli._errors import VspecError

    try:
        current = state.read_state()
    except VspecError as exc:
        return Check("state file", "warn", f"{exc.message} (the plugin treats it as disabled)")
    mode = "enabled for plain `vllm serve`" if current.enabled else "disabled for plain `vllm serve` (`vspec serve` works)"
    return Check("state file", "ok", f"{state.state_path()}: {mode}")


SAMPLING_CHECK = "sampled requests under speculation"


def sampling_check() -> Check:
    """Run vLLM's CPU expand kernel and vspec's fix on a float input (vspec_runtime/patches/cpu_expand_kernel.py).

    vLLM 0.32's CPU kernel leaves float outputs unwritten, which makes every sampled request with
    drafts emit junk; the check says whether this vLLM still has the bug and whether the patch fixes it.
    """
    try:
        import torch

        importlib.import_module("vllm._C")  # the CPU ops the kernel calls
        from vspec_runtime.patches import cpu_expand_kernel as fix

        module = importlib.import_module(fix.TARGET_MODULE)
        broken = fix.upstream_drops_float_output()
        fix.apply(module)
        output = torch.zeros(4)
        module._expand_kernel_impl(output, torch.tensor([0.5, -1.0]), torch.tensor([1, 4]), -1, 1)
        fixed = output.tolist() == [0.5, 1.0, 1.0, 1.0]
    except Exception as exc:  # noqa: BLE001 - a check reports, it does not crash doctor
        return Check(SAMPLING_CHECK, "warn", f"could not run vLLM's CPU expand kernel here ({type(exc).__name__}: {exc})")
    if not fixed:
        return Check(SAMPLING_CHECK, "fail", "vspec's cpu-expand-kernel patch does not fix vLLM's CPU expand kernel: "
                     "sampled requests with speculation would emit junk; serve greedy only or without speculation")
    if broken:
        return Check(SAMPLING_CHECK, "ok", "vLLM's CPU expand kernel drops float outputs (sampled requests with drafts "
                     "would be junk); vspec's cpu-expand-kernel patch fixes it, checked here")
    return Check(SAMPLING_CHECK, "ok", "vLLM's CPU expand kernel is correct on floats: the cpu-expand-kernel patch "
                 "is no longer needed (see docs/patches.md)")


def extension_checks(extensions: list, surface: tuple[vllm_surface.Sym, ...] = vllm_surface.SURFACE,
                     import_module: Callable[[str], Any] = importlib.import_module) -> list[Check]:
    """One check per extension (vspec_runtime.patches.Extension): ok when all its symbols are."""
    return [_extension_check(extension, surface, import_module) for extension in extensions]


CPU_CORES_CHECK = "cpu cores"


def cpu_cores_check(cpus: Optional[int] = None, environ: Optional[dict[str, str]] = None) -> Check:
    """How many of the host's CPUs the model gets under vLLM's CPU build (one worker process).

    vLLM keeps one core for its scheduler process unless ``VLLM_CPU_NUM_OF_RESERVED_CPU`` says
    otherwise; vspec sets it to 0 on hosts of 2 CPUs or fewer (vspec_cli/launch.py,
    ``front_end_reserve``). A user's own value wins; one that leaves the model half a small host warns."""
    from vspec_cli.launch import RESERVE_VARIABLE, front_end_reserve

    cpus = cpu_cores() if cpus is None else cpus
    environ = os.environ if environ is None else environ
    chosen = environ.get(RESERVE_VARIABLE)
    if chosen is None:
        vspec_reserve = front_end_reserve(cpus)
        reserve, source = (int(vspec_reserve), "vspec turns vLLM's reserve off on hosts this small") \
            if vspec_reserve is not None else (1, "vLLM keeps one for its scheduler process")
    else:
        try:
            reserve, source = int(chosen), f"{RESERVE_VARIABLE}={chosen} in your environment"
        except ValueError:
            return Check(CPU_CORES_CHECK, "warn", f"{RESERVE_VARIABLE}={chosen!r} is not a whole number; vLLM will fail to start")
    model = max(cpus - reserve, 1)
    reason = f"the model runs on {model} of {cpus} usable CPUs ({source})"
    if chosen is not None and front_end_reserve(cpus) is not None and model < cpus:
        return Check(CPU_CORES_CHECK, "warn", reason + f"; on a host this small unset {RESERVE_VARIABLE} to give it every "
                     "core (1.1-1.7x the demo's output tok/s on a 2-core host, docs/benchmarks.md)")
    return Check(CPU_CORES_CHECK, "ok", reason)


def _extension_check(extension, surface, import_module) -> Check:
    from vspec_runtime.patches import symbols_of

    name = f"extension {extension.name}"
    try:
        targets = symbols_of(extension)
    except Exception as exc:  # noqa: BLE001 - a check reports, it does not crash doctor
        return Check(name, "fail", f"cannot read its symbols from {extension.module} ({type(exc).__name__}: {exc})", "extension")
    by_target = {sym.target: sym for sym in surface}
    troubles = []
    for target in targets:
        sym = by_target.get(target)
        # An unlisted target is a vspec bug: the patch itself would refuse to apply.
        trouble = "not listed in vllm_surface.SURFACE" if sym is None else vllm_surface.problem(sym, import_module)
        if trouble:
            troubles.append(f"{target.replace(':', '.')}: {trouble}")
    if troubles:
        return Check(name, "fail", f"{extension.kind} cannot work on this vLLM: " + "; ".join(troubles), "extension")
    count = f"{len(targets)} symbol{'s' if len(targets) != 1 else ''}"
    return Check(name, "ok", f"{extension.kind}, {count} ok: {extension.why}", "extension")


def run_doctor(
    method: Optional[str] = None,
    adaptive: bool = False,
    surface: tuple[vllm_surface.Sym, ...] = vllm_surface.SURFACE,
    import_module: Callable[[str], Any] = importlib.import_module,
    plugin_probe: bool = True,
    extensions: Optional[list] = None,
) -> Report:
    """All checks for ``method``/``adaptive`` (neither: everything), plus one per extension in
    ``extensions`` (a preset's, see ``preset_scope``). Pure data; the CLI renders it."""
    probe = start_plugin_probe() if plugin_probe else None  # runs while the symbols are checked
    try:
        return _checks(method, adaptive, surface, import_module, probe, extensions or [])
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.communicate()


def _checks(method, adaptive, surface, import_module, probe, extensions) -> Report:
    py = sys.version_info
    environment: dict[str, Any] = {
        "python": {"version": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix},
        "vspec": {"version": __version__, "installed": _vspec_locations()},
        "tested_vllm": TESTED_VLLM,
    }
    report = Report(environment)
    report.checks.append(Check("python", "ok" if py >= (3, 10) else "fail",
                               f"{platform.python_version()} ({sys.executable})"))
    vllm = vllm_info(import_module)
    environment["vllm"] = vllm
    environment.update(detect_platform())
    report.checks.append(Check("torch", "ok" if environment["torch"] else "warn",
                               f"torch {environment['torch']} on {environment['platform']}" if environment["torch"]
                               else "torch is not installed"))
    if len(environment["vspec"]["installed"]) > 1:
        report.checks.append(Check("vspec copies", "warn", "more than one vspec is visible: "
                                   + "; ".join(environment["vspec"]["installed"])))
    report.checks.append(_state_check())
    if not vllm["installed"]:
        report.checks.append(Check("vllm", "fail", f"vLLM is not importable ({vllm['error']})"))
        return report
    tree = f", source tree at {vllm['git_revision'][:12]}{' (dirty)' if vllm['dirty'] else ''}" if "git_revision" in vllm else ""
    report.checks.append(Check("vllm", "ok", f"vLLM {vllm['version']} at {vllm['location']}{tree}"))
    report.checks.append(_version_check(vllm["version"]))
    for sym in vllm_surface.selected(method, adaptive, surface):
        trouble = vllm_surface.problem(sym, import_module)
        report.checks.append(Check(sym.name, "fail" if trouble else "ok", trouble or f"{sym.kind}: {sym.why}", "vllm-symbol"))
    report.checks.extend(extension_checks(extensions, surface, import_module))
    if environment["platform"] == "cpu" and method != "none":
        report.checks.append(sampling_check())
    if environment["platform"] == "cpu" and runs_on_cpu(None):
        report.checks.append(cpu_cores_check())  # vLLM's CPU wheel: the one vspec sets the reserve for
    report.checks.append(_entry_point_check())
    if probe is not None:
        report.checks.append(finish_plugin_probe(probe))
    return report


def parallel_scope(preset: Optional[str], method: Optional[str], vllm_args: tuple[str, ...]) -> dict[str, Any]:
    """The "parallel" section: the layout a preset runs with ``vllm_args`` (what `vspec serve PRESET --
    ARGS` passes to vLLM after the preset's own ``serving.extra_args``), and each feature's support
    there (vspec_cli/parallel_layout.py). Models are read where they are prepared; nothing is launched."""
    from vspec_cli import parallel_layout

    target = drafter = device = None
    extra: tuple[str, ...] = ()
    if preset is not None:
        from vspec_cli.resolve import resolve_model_paths, resolve_spec

        spec = resolve_spec(preset, None, {})
        method, extra, device = spec.method, tuple(spec.serving.extra_args), spec.serving.device
        paths = resolve_model_paths(spec, strict=False)
        target, drafter = paths.target, paths.drafter
    layout = parallel_layout.parse_layout(extra + tuple(vllm_args))
    return parallel_layout.layout_report(layout, method or "ngram", target, drafter, device)


def preset_scope(preset: str) -> tuple[str, bool, list]:
    """(method, adaptive, extensions) of a preset as `vspec serve PRESET` would run it, no flags.

    The extensions include the shims this installation runs (vspec_runtime/patches REGISTRY)."""
    from vspec_cli.resolve import resolve_spec
    from vspec_runtime import patches

    spec = resolve_spec(preset, None, {})
    return spec.method, spec.adaptive_active, patches.enabled_for(spec, include_shims=True)
