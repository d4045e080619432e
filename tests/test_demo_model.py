"""The demo model answers a request that names no sampling settings with the model card's settings.

The README's curl sends no temperature; the OpenAI default of 1.0 makes SmolLM2-135M ramble. vLLM
reads sampling defaults from the model's generation_config.json, so the demo folder carries them,
also when it was built by an earlier vspec (a second prepare adds them). Checked through vLLM's own
reader (ModelConfig), the code `vllm serve` uses, without starting an engine.
"""

from __future__ import annotations

import json
import shutil

import pytest

from vspec_cli.demo_model import SAMPLING_DEFAULTS

pytestmark = pytest.mark.vllm


def _vllm_defaults(folder) -> dict:
    from vllm.config import ModelConfig

    return ModelConfig(model=str(folder), dtype="float32").get_diff_sampling_param()


def test_vllm_serves_the_demo_with_the_model_cards_sampling_defaults(demo_model_dir):
    defaults = _vllm_defaults(demo_model_dir)
    assert defaults["temperature"] == pytest.approx(SAMPLING_DEFAULTS["temperature"])
    assert defaults["top_p"] == pytest.approx(SAMPLING_DEFAULTS["top_p"])


def test_a_demo_folder_from_an_earlier_version_gets_the_defaults_on_prepare(demo_model_dir, tmp_path):
    old = tmp_path / "demo"
    shutil.copytree(demo_model_dir, old, ignore=shutil.ignore_patterns("*.safetensors"))
    for weights in demo_model_dir.glob("*.safetensors"):
        (old / weights.name).symlink_to(weights)  # 0.5 GB not copied: nothing here reads it
    config_path = old / "generation_config.json"
    config = json.loads(config_path.read_text())
    for key in SAMPLING_DEFAULTS:
        config.pop(key)
    config_path.write_text(json.dumps(config))
    assert "temperature" not in _vllm_defaults(old)

    from vspec_cli import model_store

    registry = tmp_path / "models.json"
    model_store.register("demo", old, role="target", registry=registry)
    prepared = model_store.prepare("demo", registry=registry)  # `vspec models prepare demo`: already present
    assert prepared.path == str(old)

    assert _vllm_defaults(old)["temperature"] == pytest.approx(SAMPLING_DEFAULTS["temperature"])
    assert json.loads(config_path.read_text())["eos_token_id"] == config["eos_token_id"]  # the rest is kept
