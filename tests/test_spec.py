"""RuntimeSpec: the CLI-runtime contract survives the trip through the environment, and bad values
are refused with one line naming the field, the value and what is allowed."""

import pytest

from vspec_runtime.spec import RuntimeSpec, SpecError, validate_spec

EVERY_FIELD_SET = {
    "method": "eagle", "target_model": "/models/t", "drafter": "/models/head", "gamma": 5,
    "ngram_min": 2, "ngram_max": 3,
    "adaptive": {"enabled": True, "policy": "table", "min_gamma": 1, "max_gamma_step": 3, "control_interval": 2,
                 "hysteresis": 0.1, "online_window": 16, "online_exploration": 0.2, "model_guided": False,
                 "gamma0_mode": "sync", "fixed_gamma": 2, "table": {1: 5, 8: 2}, "trace": "/tmp/t.jsonl",
                 "samples": "/tmp/s.jsonl", "seed": 7, "entropy_stop": True, "entropy_topk": 4,
                 "entropy_threshold": 0.5, "entropy_scale": 0.2},
    "relaxed": {"margin": 1.5, "topk": 3, "from_position": 1, "after_tokens": 8, "protected_token_ids": [2, 7]},
    "serving": {"host": "0.0.0.0", "port": 9000, "device": "0,1", "max_num_seqs": 64, "max_model_len": 4096,
                "max_num_batched_tokens": 8192, "dtype": "bfloat16", "gpu_memory_utilization": 0.8,
                "served_model_name": "m", "extra_args": ["--enforce-eager"]},
}


def test_round_trip_through_json_is_lossless():
    spec = validate_spec(EVERY_FIELD_SET)
    again = RuntimeSpec.from_json(spec.to_json())
    assert again == spec
    assert again.adaptive.table == {1: 5, 8: 2} and again.relaxed.protected_token_ids == (2, 7)


def test_defaults_round_trip_too():
    spec = validate_spec({"target_model": "demo"})
    assert RuntimeSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("data,message", [
    ({"gamma": 0}, "gamma: got 0; input should be greater than or equal to 1"),
    ({"method": "medusa"}, "method: got 'medusa'; input should be 'ngram', 'draft', 'eagle', 'eagle3' or 'none'"),
    ({"adaptive": {"policy": "greedy"}}, "adaptive.policy: got 'greedy'"),
    ({"serving": {"colour": "red"}}, "unknown key 'serving.colour'"),
    ({"method": "ngram", "relaxed": {"margin": 1.0}}, "relaxed acceptance needs method draft, eagle or eagle3"),
    ({"adaptive": {"enabled": True, "policy": "sweep"}}, "policy 'sweep' needs the list of K values"),
    ({"gamma": 3, "adaptive": {"table": {1: 4}}}, "adaptive.table: entry 1 -> 4"),
])
def test_bad_values_give_one_line(data, message):
    with pytest.raises(SpecError) as error:
        validate_spec({"target_model": "demo", **data})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_garbage_in_the_environment_is_a_clear_error():
    with pytest.raises(SpecError, match="not valid JSON"):
        RuntimeSpec.from_json("{not json")
