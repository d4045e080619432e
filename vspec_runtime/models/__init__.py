"""Out-of-tree model architectures vspec registers with vLLM (a supported extension point, no patch).

``register_models()`` runs in every vLLM process through ``patches.apply_all`` when vspec is
active. Registration is lazy (``"module:Class"``): nothing here imports torch or vLLM's model
code until vLLM instantiates the model.

Qwen2 EAGLE-1 heads: the reference plugin's users serve Qwen2.5 with heads whose config says
``Qwen2ForCausalLMEagle``; vLLM 0.32 dropped that class. Under ``method=eagle`` vLLM renames a
head's architecture X to ``"Eagle" + X`` unless it already starts with "Eagle"
(vllm/transformers_utils/configs/eagle.py), and it resolves the original name once before that
while building the draft ModelConfig. So all of these must resolve:

  Qwen2ForCausalLMEagle        the checkpoint's own name (draft ModelConfig)
  EagleQwen2ForCausalLMEagle   what vLLM renames it to under method=eagle
  EagleQwen2ForCausalLM        a head whose config says plain Qwen2ForCausalLM

An architecture that vLLM already knows is left alone: if upstream brings the model back, its
class wins and this registration can be deleted.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vspec.models")

QWEN2_EAGLE_CLASS = "vspec_runtime.models.qwen2_eagle:EagleQwen2ForCausalLM"
QWEN2_EAGLE_ARCHITECTURES = (
    "Qwen2ForCausalLMEagle",
    "EagleQwen2ForCausalLMEagle",
    "EagleQwen2ForCausalLM",
)


def register_models(spec: object = None) -> tuple[str, ...]:
    """Register what vLLM lacks; returns the architectures registered now (empty when nothing was).

    ``spec`` is unused: the heads are registered whenever vspec is active, whatever its method,
    since a plain `vllm serve` under `vspec enable` may serve any of them."""
    from vllm import ModelRegistry

    supported = ModelRegistry.get_supported_archs()
    registered = []
    for architecture in QWEN2_EAGLE_ARCHITECTURES:
        if architecture in supported:
            continue
        ModelRegistry.register_model(architecture, QWEN2_EAGLE_CLASS)
        registered.append(architecture)
    if registered:
        logger.debug("vspec registered %s -> %s", ", ".join(registered), QWEN2_EAGLE_CLASS)
    return tuple(registered)
