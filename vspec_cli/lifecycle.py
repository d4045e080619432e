"""What `vspec install`, `upgrade`, `rollback` and `uninstall` do: pip on this interpreter's environment.

The commands themselves (options, output) are vspec_cli/commands/lifecycle.py.

Each command is planned first (the exact pip commands, the state changes, what a failure would run
to restore the previous version), so `--dry-run` prints the same shape a real run returns. A real
run holds the state lock, runs pip, checks that the expected version is installed, runs
`vspec doctor` in a fresh process (the new code), and only then records the new state. Any failure,
Ctrl-C included, puts back the state file and the previously installed version.

Only the vspec distribution in this environment is touched: never vLLM, torch or models, never a
copy in a parent environment, never a running vLLM process (the output says to restart them).

Where a version comes from (a wheel, a source tree, the index) and how to reinstall it is
vspec_cli/install_sources.py; the plans and the transaction stay together here because the four
plans share one transaction (lock, pip, version check, doctor in the new code, state write,
restore on any failure).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer
from packaging.version import Version

from vspec_cli import _output, installation, state
# LifecycleFailed is raised here and stays importable from this module, where it used to live.
from vspec_cli._errors import LifecycleFailed, PreconditionError, UserInputError, VspecError
from vspec_cli.install_sources import (DIST, editable_source, index_source, pip_requirement, source_of_copy,
                                       wheel_source)

EXTRAS = ("cpu", "cuda", "ascend")
CHECK_TIMEOUT_S = 600
# The installed vspec, not a source tree that happens to be the working directory (`python -c`
# puts the cwd first on sys.path).
_RUN_CLI = ("import sys\nif sys.path and sys.path[0] in ('', '.'): del sys.path[0]\n"
            "sys.argv[0] = 'vspec'\nfrom vspec_cli.app import main\nmain()")


# --- plans ------------------------------------------------------------------------------------


@dataclass
class Plan:
    action: str
    from_version: Optional[str]
    to_version: Optional[str]  # None: known only once pip has run (editable tree, latest from the index)
    source: Optional[str]
    pip_commands: list[list[str]]
    restore_commands: list[list[str]]
    state_after: dict  # top-level keys -> new values (None removes the key)
    check: bool = True


@dataclass
class Outcome:
    action: str
    dry_run: bool
    python: str
    from_version: Optional[str]
    to_version: Optional[str]
    pip_commands: list[list[str]]
    restore_commands: list[list[str]]
    state_file: str
    state_changes: list[dict]
    check: str
    restart: str
    messages: list[str] = field(default_factory=list)


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


def _install_cmd(source: str, extra: Optional[str], no_deps: bool, no_cache: bool) -> list[str]:
    flags = ["install", "--disable-pip-version-check"]
    flags += ["--no-cache-dir"] if no_cache else []
    flags += ["--no-deps"] if no_deps else []
    return _pip(*flags, *pip_requirement(source, extra))


def _restore_cmds(here: Optional[installation.InstalledCopy], recorded: dict[str, str]) -> list[list[str]]:
    if here is None:
        return [_pip("uninstall", "--yes", "--disable-pip-version-check", DIST)]
    return [_install_cmd(source_of_copy(here, recorded), None, no_deps=True, no_cache=True)]


def plan_install(editable: Optional[Path], wheel: Optional[Path], version: Optional[str], extra: Optional[str],
                 enable: bool, no_deps: bool, check: bool) -> Plan:
    if sum(x is not None for x in (editable, wheel, version)) > 1:
        raise UserInputError("give at most one of --editable, --wheel, --version")
    _check_extra(extra)
    if wheel is not None:
        source, target = wheel_source(wheel)
    elif editable is not None:
        source, target = editable_source(editable)
    else:
        source, target = index_source(version)
    return _plan_change("install", source, target, extra, no_deps, no_cache=False, check=check,
                        enable=True if enable else None)


def plan_upgrade(version: Optional[str], wheel: Optional[Path], no_deps: bool, check: bool) -> Plan:
    if (version is None) == (wheel is None):
        raise UserInputError("give exactly one of --version or --wheel")
    source, target = wheel_source(wheel) if wheel is not None else index_source(version)
    here = _require_here("upgrade")
    if Version(target) < Version(here.version):
        raise UserInputError(f"{target} is older than the installed {here.version}",
                             hint=f"use `vspec rollback --to {target}`")
    return _plan_change("upgrade", source, target, None, no_deps, no_cache=True, check=check)


def plan_rollback(to: Optional[str], wheel: Optional[Path], no_deps: bool, check: bool) -> Plan:
    if to is not None and wheel is not None:
        raise UserInputError("give at most one of --to or --wheel")
    current = state.read_state()
    here = _require_here("rollback")
    if wheel is not None:
        source, target = wheel_source(wheel)
    else:
        if to is None:
            if not current.previous_versions:
                raise PreconditionError("no earlier version is recorded in the state file",
                                        hint="use `vspec rollback --to VERSION` or `--wheel FILE`")
            to = current.previous_versions[-1]
        _, target = index_source(to)
        source = current.sources.get(target, f"index:{target}")
    if Version(target) > Version(here.version):
        raise UserInputError(f"{target} is newer than the installed {here.version}",
                             hint=f"use `vspec upgrade --version {target}`")
    return _plan_change("rollback", source, target, None, no_deps, no_cache=True, check=check)


def plan_uninstall() -> Plan:
    copies = installation.visible_copies()
    parents = [c for c in copies if not c.here]
    if parents:
        where = "; ".join(f"vspec {c.version} in {c.location}" for c in parents)
        raise PreconditionError(
            f"refusing to uninstall: another vspec stays visible from a parent environment ({where}), so vLLM "
            "would keep loading it; vspec does not touch environments other than this one",
            hint="uninstall it with that environment's own pip, or use a virtual environment without "
                 "--system-site-packages",
        )
    here = _require_here("uninstall")
    current = state.read_state()
    previous = _pushed(current.previous_versions, here.version)
    return Plan("uninstall", here.version, None, None,
                [_pip("uninstall", "--yes", "--disable-pip-version-check", DIST)],
                [_install_cmd(source_of_copy(here, current.sources), None, no_deps=True, no_cache=True)],
                {"enabled": False, "installed_version": None, "installed_source": None,
                 "previous_versions": previous},
                check=False)


def _plan_change(action: str, source: str, target: Optional[str], extra: Optional[str], no_deps: bool,
                 no_cache: bool, check: bool, enable: Optional[bool] = None) -> Plan:
    current = state.read_state()
    here = installation.installed_here()
    if action != "install" and here is not None and target == here.version:
        raise UserInputError(f"vspec {target} is already installed in this environment")
    from_version = here.version if here else None
    if action == "rollback":
        previous = list(current.previous_versions)
        if target in previous:
            previous = previous[: len(previous) - 1 - previous[::-1].index(target)]
    else:
        previous = _pushed(current.previous_versions, from_version) if from_version != target else list(current.previous_versions)
    after = {"installed_version": target, "installed_source": source, "previous_versions": previous}
    if enable is not None:
        after["enabled"] = enable
    return Plan(action, from_version, target, source, [_install_cmd(source, extra, no_deps, no_cache)],
                _restore_cmds(here, current.sources), after, check=check)


def _pushed(versions: tuple[str, ...], version: Optional[str]) -> list[str]:
    kept = [v for v in versions if v != version]
    return kept + [version] if version else kept


def _require_here(action: str) -> installation.InstalledCopy:
    here = installation.installed_here()
    if here is None:
        raise PreconditionError(f"cannot {action}: vspec is not installed in this environment ({sys.prefix})",
                                hint="use `vspec install --wheel FILE` or `vspec install --version V`")
    return here


def _check_extra(extra: Optional[str]) -> None:
    if extra is not None and extra not in EXTRAS:
        raise UserInputError(f"--extra must be one of {', '.join(EXTRAS)}, not '{extra}'")


# --- execution --------------------------------------------------------------------------------


def _changes(plan: Plan, before: dict, after: dict) -> list[dict]:
    changes = []
    for key in plan.state_after:
        value = after.get(key)
        if key == "installed_version" and value is None and plan.action != "uninstall":
            value = "(the version pip installs)"
        if before.get(key) != value:
            changes.append({"key": key, "from": before.get(key), "to": value})
    return changes


def execute(plan: Plan, dry_run: bool, yes: bool) -> Outcome:
    before = state.read_state().as_dict()
    outcome = Outcome(plan.action, dry_run, sys.executable, plan.from_version, plan.to_version, plan.pip_commands,
                      plan.restore_commands, str(state.state_path()), _changes(plan, before, plan.state_after),
                      _check_label(plan, dry_run), "")
    if dry_run:
        outcome.restart = "after a real run: " + installation.restart_notice(installation.running_vllm_servers())
        return outcome
    _confirm(plan, yes)
    with state.lock():
        saved = state.read_text()
        try:
            for command in plan.pip_commands:
                _run_pip(command)
            installed = installation.installed_here()
            if plan.action == "uninstall":
                if installed is not None:
                    raise LifecycleFailed(f"pip reported success but vspec {installed.version} is still installed here")
            else:
                if installed is None or (plan.to_version and installed.version != plan.to_version):
                    found = installed.version if installed else "nothing"
                    raise LifecycleFailed(f"pip reported success but {found} is installed, not {plan.to_version}")
                outcome.to_version = plan.to_version = installed.version
                plan.state_after["installed_version"] = installed.version
                if plan.source == "index:":  # "the latest": record what that was, so rollback can return to it
                    plan.source = plan.state_after["installed_source"] = f"index:{installed.version}"
            if plan.check:
                outcome.check = _post_check(plan.to_version)
            _record(plan)
        except BaseException as exc:
            _roll_back(plan, saved, outcome)
            if isinstance(exc, KeyboardInterrupt):
                raise LifecycleFailed(f"{plan.action} interrupted; {outcome.messages[-1]}") from None
            if isinstance(exc, VspecError):
                raise LifecycleFailed(f"{exc.message}; {outcome.messages[-1]}", hint=exc.hint) from None
            raise
    outcome.state_changes = _changes(plan, before, state.read_state().as_dict())
    outcome.restart = installation.restart_notice(installation.running_vllm_servers())
    return outcome


def _check_label(plan: Plan, dry_run: bool) -> str:
    if plan.action == "uninstall":
        return "not needed"
    if not plan.check:
        return "skipped (--no-check)"
    return "would run `vspec doctor` in the new environment" if dry_run else "pending"


def _record(plan: Plan) -> None:
    with state.editing() as document:
        state.set_values(document, **{k: v for k, v in plan.state_after.items()})
        if plan.source and plan.to_version:
            state.set_source(document, plan.to_version, plan.source)
        state.append_history(document, plan.action, **{"from": plan.from_version, "to": plan.to_version})


def _roll_back(plan: Plan, saved_state: Optional[str], outcome: Outcome) -> None:
    state.restore_text(saved_state)
    now = installation.installed_here()
    now_version = now.version if now else None
    if now_version == plan.from_version:
        outcome.messages.append(f"nothing changed: {_describe(plan.from_version)} is installed and the state file is as before")
        return
    try:
        for command in plan.restore_commands:
            _run_pip(command)
    except (LifecycleFailed, KeyboardInterrupt) as exc:
        outcome.messages.append(f"restoring {_describe(plan.from_version)} FAILED ({exc}); run: "
                                + " && ".join(" ".join(c) for c in plan.restore_commands))
        return
    outcome.messages.append(f"restored {_describe(plan.from_version)} and the state file")


def _describe(version: Optional[str]) -> str:
    return f"vspec {version}" if version else "the environment without vspec"


def _run_pip(command: list[str]) -> None:
    """Run pip with its output on stderr (stdout stays clean for --json); raise with its last lines."""
    _output.hint("$ " + " ".join(command))
    tail: collections.deque[str] = collections.deque(maxlen=15)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        sys.stderr.write(line)
        tail.append(line.rstrip())
    code = process.wait()
    if code != 0:
        errors = [line for line in tail if line.startswith("ERROR")] or list(tail)[-3:]
        raise LifecycleFailed(f"pip exited with {code}: {' '.join(errors).strip()}")


def _post_check(expected: Optional[str]) -> str:
    """`vspec doctor --json` from a fresh interpreter, so the newly installed code is what runs."""
    _output.hint("checking the new installation with `vspec doctor`")
    done = subprocess.run([sys.executable, "-c", _RUN_CLI, "doctor", "--json"], capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT_S)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise LifecycleFailed(f"`vspec doctor` did not run in the new installation: "
                              f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}") from None
    if "error" in report:  # under --json a failing doctor prints a vspec/error/1 object instead of its report
        raise LifecycleFailed(f"`vspec doctor` did not run in the new installation: {report['error'].get('message')}")
    running = report.get("environment", {}).get("vspec", {}).get("version")
    if expected and running != expected:
        raise LifecycleFailed(f"the new installation imports vspec {running}, not {expected}")
    failed = [f"{c['name']}: {c['reason']}" for c in report.get("checks", []) if c["status"] == "fail"]
    if failed:
        raise LifecycleFailed("`vspec doctor` failed after the change: " + "; ".join(failed),
                              hint="fix the cause, or pass --no-check to keep such an installation")
    counts = report.get("summary", {})
    return f"vspec doctor: {counts.get('ok', 0)} ok, {counts.get('warn', 0)} warn, 0 fail"


def _confirm(plan: Plan, yes: bool) -> None:
    if yes:
        return
    what = f"{plan.action} vspec" + (f" {plan.from_version}" if plan.from_version else "") + (
        f" -> {plan.to_version}" if plan.to_version and plan.action != "uninstall" else "")
    question = f"{what} in {sys.prefix}?"
    if not sys.stdin.isatty():
        raise UserInputError(f"'{question}' needs confirmation and there is no terminal", hint="use --yes")
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)
