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


def test_patch_docs_are_current():
    from vspec_runtime import patches

    assert (REPO / "docs" / "patches.md").read_text() == patches.render_markdown(), (
        "docs/patches.md is stale: run `python -m vspec_runtime.patches > docs/patches.md`"
    )


# Built at run time so that this file does not cite them itself.
_ABSENT_DOCS = ("DESIGN" + ".md", "STYLE" + ".md")
_CITATION_SCOPE = ("vspec_cli", "vspec_runtime", "tests", "scripts", "presets", "docs", "README.md")
_CITATION_SKIP: tuple[str, ...] = ()


def test_no_citations_of_documents_outside_the_repository():
    """Code, tests and docs point into the repository (docs/architecture.md, ...), never at a
    design or style document that is not in it."""
    import re

    pattern = re.compile("|".join(re.escape(name) for name in _ABSENT_DOCS))
    offenders = []
    for top in _CITATION_SCOPE:
        root = REPO / top
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts or path.relative_to(REPO).as_posix().startswith(_CITATION_SKIP):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary files (weights, images)
            for number, line in enumerate(text.splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, (
        "these cite files that are not in the repository; point into it (docs/architecture.md, a "
        "section name) or say it in one line:\n" + "\n".join(offenders)
    )
