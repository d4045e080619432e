"""The wheel must carry every package: pyproject lists them by hand (presets/ and profiles/ are mapped)."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_python_package_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for top in ("vspec_cli", "vspec_runtime"):
        for init in (REPO / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(REPO).parts))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert {"vspec_presets", "vspec_profiles", "vspec_drafters"} <= listed
    assert config["package-dir"] == {"vspec_presets": "presets", "vspec_profiles": "profiles",
                                     "vspec_drafters": "drafters"}


def test_entry_points_are_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["vspec"] == "vspec_cli.app:main"
    assert project["entry-points"]["vllm.general_plugins"]["vspec"] == "vspec_runtime.plugin:register"
