"""vspec_runtime.control stays pure Python: no vLLM, torch or numpy, and cheap to import."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import vspec_runtime.control as control

FORBIDDEN = {"vllm", "torch", "numpy"}
CONTROL_DIR = pathlib.Path(control.__file__).parent


def imported_roots(path: pathlib.Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_heavy_imports_in_source():
    files = sorted(CONTROL_DIR.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        assert not imported_roots(path) & FORBIDDEN, path.name


def test_importing_control_loads_no_heavy_module():
    code = (
        "import sys, vspec_runtime.control, vspec_runtime.control.simulate, vspec_runtime.control.budget;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r}))"
    )
    root = CONTROL_DIR.parent.parent
    output = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"
