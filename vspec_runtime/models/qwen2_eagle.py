"""EAGLE-1 heads for Qwen2 targets (``Qwen2ForCausalLMEagle``), which vLLM 0.32 no longer ships.

Registered lazily through ``ModelRegistry.register_model`` (see ``vspec_runtime.models``); this
module is imported only inside vLLM's model loader, so it may import vLLM and torch freely.

The head mirrors vLLM's own Llama EAGLE-1 model (``vllm/model_executor/models/llama_eagle.py``):
``fc(cat[embed(next token), target hidden])``, then Qwen2 decoder layers, the first one without its
input norm, no final norm; embedding and LM head are shared with the target by vLLM's proposer
unless the checkpoint carries its own embedding. What Qwen2 adds: q/k/v projections with biases
(Qwen2Attention always builds them) and the original EAGLE fc bias.

Checkpoints differ in which biases they carry. A bias the checkpoint lacks is set to zero (the
same function as no bias), deterministically, and logged once per process; without that, vLLM
would leave the parameter as uninitialised memory. ``lm_head.*`` in a checkpoint is ignored: an
EAGLE-1 head predicts through the target's LM head (sglang's Qwen2 EAGLE loader does the same).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn as nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Model
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    get_draft_quant_config,
    maybe_prefix,
    process_eagle_weight,
)

logger = logging.getLogger("vspec.models")

QKV_BIAS_NAMES = ("q_proj.bias", "k_proj.bias", "v_proj.bias")
_logged: set[str] = set()


def _log_once(message: str, *args: object) -> None:
    key = message % args
    if key not in _logged:
        _logged.add(key)
        logger.warning(message, *args)


class Qwen2EagleDecoderLayer(Qwen2DecoderLayer):
    """A Qwen2 decoder layer; EAGLE-1's first layer takes fc's output without an input norm."""

    def __init__(self, vllm_config: VllmConfig, config, disable_input_layernorm: bool, prefix: str = "") -> None:
        super().__init__(
            config,
            cache_config=vllm_config.cache_config,
            quant_config=get_draft_quant_config(vllm_config),  # the drafter's, not the target's
            prefix=prefix,
        )
        if disable_input_layernorm:
            del self.input_layernorm
            self.input_layernorm = nn.Identity()


# Explicit because this module's annotations are strings (the decorator infers from real types).
@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "hidden_states": 0})
class Qwen2EagleModel(nn.Module):
    hf_to_vllm_mapper = Qwen2Model.hf_to_vllm_mapper  # q/k/v -> qkv_proj, gate/up -> gate_up_proj

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", start_layer_id: int = 0) -> None:
        super().__init__()
        speculative_config = vllm_config.speculative_config
        assert speculative_config is not None
        self.config = speculative_config.draft_model_config.hf_config
        self.vocab_size = self.config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(
            self.config.vocab_size, self.config.hidden_size, prefix=maybe_prefix(prefix, "embed_tokens"))
        # Attention layers are named after the target's last layer so their KV caches stay apart.
        self.layers = nn.ModuleList([
            Qwen2EagleDecoderLayer(vllm_config, self.config, disable_input_layernorm=(index == 0),
                                   prefix=maybe_prefix(prefix, f"layers.{index + start_layer_id}"))
            for index in range(self.config.num_hidden_layers)
        ])
        self.fc = ReplicatedLinear(
            input_size=self.config.hidden_size * 2,
            output_size=self.config.hidden_size,
            bias=True,  # original EAGLE-1 heads have one; zero when the checkpoint has none
            params_dtype=vllm_config.model_config.dtype,
            quant_config=get_draft_quant_config(vllm_config),
            prefix=maybe_prefix(prefix, "fc"),
            return_bias=False,
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        input_embeds = self.embed_tokens(input_ids)
        hidden_states = self.fc(torch.cat((input_embeds, hidden_states), dim=-1))
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states = hidden_states + residual
        return hidden_states, hidden_states

    def zero_biases(self) -> None:
        """Biases start at zero so whatever the checkpoint does not carry is a no-op, not garbage."""
        with torch.no_grad():
            self.fc.bias.zero_()
            for layer in self.layers:
                layer.self_attn.qkv_proj.bias.zero_()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)


class EagleQwen2ForCausalLM(Qwen2ForCausalLM):
    """The class vLLM instantiates for a ``Qwen2ForCausalLMEagle`` head under ``method=eagle``.

    Subclasses Qwen2ForCausalLM for its interfaces (SupportsEagle, compute_logits) only, exactly as
    vLLM's EagleLlamaForCausalLM does with LlamaForCausalLM.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        speculative_config = vllm_config.speculative_config
        assert speculative_config is not None
        self.config = speculative_config.draft_model_config.hf_config
        if getattr(self.config, "draft_vocab_size", None) is None:
            self.config.draft_vocab_size = getattr(self.config, "vocab_size", None)
        target_layer_num = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.model = Qwen2EagleModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"),
                                     start_layer_id=target_layer_num)
        self.logits_processor = LogitsProcessor(self.config.vocab_size,
                                                scale=getattr(self.config, "logit_scale", 1.0))
        # lm_head is attached by vLLM's proposer (the target's) after loading.

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs_embeds is not None:
            raise NotImplementedError(f"{type(self).__name__} does not support multimodal inputs")
        return self.model(input_ids, positions, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        self.model.zero_biases()
        seen: set[str] = set()
        ignored: list[str] = []

        def checkpoint_weights():
            for name, tensor in weights:
                if name.startswith("lm_head.") or ".lm_head." in name:
                    ignored.append(name)
                    continue
                name = name.removeprefix("model.")
                seen.add(name)
                process_eagle_weight(self, name)  # notes an own embed_tokens for the proposer
                yield f"model.{name}", tensor

        loaded = AutoWeightsLoader(self).load_weights(checkpoint_weights())
        logger.info("vspec: loaded a Qwen2 EAGLE-1 head (%d layer(s)) as %s", len(self.model.layers), type(self).__name__)
        self._report_defaults(seen, ignored)
        # Filled with zeros or shared from the target after loading: initialised either way.
        loaded |= {name for name, _ in self.named_parameters() if name.endswith(".bias")}
        if not self.has_own_embed_tokens:
            loaded.add("model.embed_tokens.weight")
        return loaded

    def _report_defaults(self, seen: set[str], ignored: list[str]) -> None:
        missing_qkv = sorted(
            f"layers.{index}.self_attn.{bias}"
            for index in range(len(self.model.layers))
            for bias in QKV_BIAS_NAMES
            if f"layers.{index}.self_attn.{bias}" not in seen
        )
        if missing_qkv:
            _log_once("vspec: the Qwen2 EAGLE head has no QKV biases (%s); using zero biases", ", ".join(missing_qkv))
        if "fc.bias" not in seen:
            _log_once("vspec: the Qwen2 EAGLE head has no fc bias; using a zero bias")
        if ignored:
            _log_once("vspec: ignoring %s in the Qwen2 EAGLE head: EAGLE-1 uses the target's LM head", ", ".join(ignored))
