"""Generated files must match their generators: a stale checked-in copy misleads users."""

from pathlib import Path

from vspec_runtime import envs

REPO = Path(__file__).resolve().parents[1]


def test_env_var_docs_are_current():
    assert (REPO / "docs" / "envs.md").read_text() == envs.render_markdown(), (
        "docs/envs.md is stale: run `python -m vspec_runtime.envs > docs/envs.md`"
    )


def test_every_vspec_variable_used_in_code_is_registered():
    import re

    used = set()
    for path in list((REPO / "vspec_cli").rglob("*.py")) + list((REPO / "vspec_runtime").rglob("*.py")):
        used |= set(re.findall(r"[\"'](VSPEC_[A-Z_]+)[\"']", path.read_text()))
    unregistered = {name for name in used if name not in envs.ENV_VARS and not name.startswith("VSPEC_MODEL_PATH_")}
    assert not unregistered, f"register these in vspec_runtime/envs.py: {sorted(unregistered)}"
