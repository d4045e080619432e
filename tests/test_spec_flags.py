"""Spec flags are tied to RuntimeSpec: one way per field, named by the rule, old names kept, help at 80 columns.

The rule (vspec_cli/spec_flags.py): `--<field>` for top-level and serving fields, `--<section>-<field>`
for the others, underscores as dashes; fields without a flag of their own are set with
`--set section.field=value`. Each check below runs the real CLI (`vspec serve --dry-run --json`) and
reads the spec it would ship to vLLM.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from cli_helpers import run_cli
from vspec_runtime.spec import RuntimeSpec

BASE_PRESET = "eagle"  # a model drafter, so the relaxed and confidence-stop fields validate too
NON_SPEC_OPTIONS = {"--config", "--no-speculation", "--dry-run", "--json", "--list-presets", "--help", "--set"}


def leaf_keys(model: type[BaseModel] = RuntimeSpec, prefix: str = "") -> list[str]:
    keys = []
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            keys += leaf_keys(info.annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def rule_flag(key: str) -> str:
    section, _, field = key.rpartition(".")
    words = field if section in ("", "serving") else f"{section}_{field}"
    return "--" + words.replace("_", "-")


# key -> (value as typed, value expected in the spec). Not the base preset's value, except `version`,
# which has one valid value. A new spec field needs a line here: that is the point of the test.
SAMPLES: dict[str, tuple[str, Any]] = {
    "version": ("1", 1),
    "method": ("draft", "draft"),
    "target_model": ("demo", "demo"),
    "drafter": ("my-head", "my-head"),
    "gamma": ("3", 3),
    "ngram_min": ("2", 2),
    "ngram_max": ("3", 3),
    "adaptive.enabled": ("false", False),
    "adaptive.policy": ("fixed", "fixed"),
    "adaptive.profile": ("profiles/demo-cpu.json", "profiles/demo-cpu.json"),
    "adaptive.min_gamma": ("2", 2),
    "adaptive.max_gamma_step": ("3", 3),
    "adaptive.control_interval": ("2", 2),
    "adaptive.hysteresis": ("0.1", 0.1),
    "adaptive.online_window": ("16", 16),
    "adaptive.online_exploration": ("0.05", 0.05),
    "adaptive.model_guided": ("false", False),
    "adaptive.batch_acceptance": ("false", False),
    "adaptive.token_costs": ("false", False),
    "adaptive.coverage_weighting": ("false", False),
    "adaptive.acceptance_model": ("run", "run"),
    "adaptive.visit_value": ("false", False),
    "adaptive.firm_up_follow_through": ("true", True),
    "adaptive.batch_normalized_costs": ("true", True),
    "adaptive.start_gamma": ("1", 1),
    "adaptive.gamma0_mode": ("sync", "sync"),
    "adaptive.gamma0_reprobe_steps": ("64", 64),
    "adaptive.fixed_gamma": ("3", 3),
    "adaptive.table": ("{1 = 3, 8 = 1}", {1: 3, 8: 1}),
    "adaptive.trace": ("trace.jsonl", "trace.jsonl"),
    "adaptive.samples": ("samples.jsonl", "samples.jsonl"),
    "adaptive.sweep_gammas": ("0,2", (0, 2)),
    "adaptive.seed": ("7", 7),
    "adaptive.entropy_stop": ("true", True),
    "adaptive.per_request": ("true", True),
    "adaptive.entropy_topk": ("4", 4),
    "adaptive.entropy_threshold": ("0.2", 0.2),
    "adaptive.entropy_scale": ("0.3", 0.3),
    "relaxed.margin": ("0.5", 0.5),
    "relaxed.topk": ("3", 3),
    "relaxed.from_position": ("1", 1),
    "relaxed.after_tokens": ("4", 4),
    "relaxed.protected_token_ids": ("2,5", (2, 5)),
    "serving.host": ("0.0.0.0", "0.0.0.0"),
    "serving.port": ("9100", 9100),
    "serving.device": ("0,1", "0,1"),
    "serving.max_num_seqs": ("4", 4),
    "serving.max_model_len": ("512", 512),
    "serving.max_num_batched_tokens": ("2048", 2048),
    "serving.dtype": ("float16", "float16"),
    "serving.gpu_memory_utilization": ("0.5", 0.5),
    "serving.served_model_name": ("m", "m"),
    "serving.extra_args": ("--enforce-eager", ("--enforce-eager",)),
}
# What a sample needs besides itself to make a valid spec.
COMPANIONS: dict[str, tuple[str, ...]] = {"adaptive.profile": ("--adaptive-policy", "profile")}


def click_command(*path: str) -> Any:
    from typer.main import get_command

    from vspec_cli.app import app

    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def is_shown_option(param: Any) -> bool:
    # Typer builds its commands on its own copy of Click, so compare by kind, not by class.
    return param.param_type_name == "option" and not param.hidden


def visible_options(command: Any) -> dict[str, Any]:
    """Every option name shown in --help ('--x' and its '--no-x' twin) -> its Click option."""
    return {name: param for param in command.params if is_shown_option(param)
            for name in (*param.opts, *param.secondary_opts)}


def serve_spec(capsys, *args: str) -> dict[str, Any]:
    result = run_cli(capsys, "serve", BASE_PRESET, *args, "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    return RuntimeSpec.from_json(json.loads(result.stdout)["env"]["VSPEC_SPEC"]).model_dump()


def flatten(spec: dict[str, Any]) -> dict[str, Any]:
    """A dumped spec by dotted leaf key, like leaf_keys() (a table field stays one value)."""
    sections = {key.split(".")[0] for key in leaf_keys() if "." in key}
    flat = {}
    for name, value in spec.items():
        if name in sections:
            flat.update({f"{name}.{field}": field_value for field, field_value in value.items()})
        else:
            flat[name] = value
    return flat


def args_setting(key: str, text: str, flags: dict[str, Any]) -> list[str]:
    """The command line that sets `key` to `text`: its own flag when it has one, else --set."""
    flag = rule_flag(key)
    if flag not in flags:
        return ["--set", f"{key}={text}"]
    if flags[flag].is_bool_flag:
        return [flag if text == "true" else "--no-" + flag.removeprefix("--")]
    return [flag, text]


def test_every_spec_field_has_a_sample():
    assert sorted(SAMPLES) == sorted(leaf_keys())


def test_every_visible_spec_flag_has_one_name_given_by_the_rule():
    by_rule = {rule_flag(key): key for key in leaf_keys()}
    assert len(by_rule) == len(leaf_keys())  # the rule gives each field its own name
    for param in click_command("serve").params:
        if not is_shown_option(param) or param.opts[0] in NON_SPEC_OPTIONS:
            continue
        (name,) = param.opts  # one visible name per field
        assert name in by_rule, f"{name} does not follow the naming rule for any spec field"
        if param.is_bool_flag:
            assert param.secondary_opts == ["--no-" + name.removeprefix("--")]


@pytest.mark.parametrize("key", leaf_keys())
def test_each_field_is_set_by_exactly_one_way_and_nothing_else_moves(capsys, key):
    flags = visible_options(click_command("serve"))
    text, expected = SAMPLES[key]
    companions = COMPANIONS.get(key, ())
    before = flatten(serve_spec(capsys))
    after = flatten(serve_spec(capsys, *companions, *args_setting(key, text, flags)))
    assert after[key] == expected
    changed = {k for k in after if after[k] != before[k]}
    companion_keys = {k for k in leaf_keys() if rule_flag(k) in companions}
    assert changed - companion_keys == ({key} if key != "version" else set())
    if rule_flag(key) in flags:  # one way per field: --set refuses a field that has a flag
        refused = run_cli(capsys, "serve", BASE_PRESET, "--set", f"{key}={text}", "--dry-run")
        assert refused.exit_code == 2 and rule_flag(key) in refused.stderr


OLD_NAMES = [
    (["--no-adaptive-speculation"], "adaptive.enabled", False),
    (["--adaptive-trace", "t.jsonl"], "adaptive.trace", "t.jsonl"),
    (["--adaptive-entropy-stop"], "adaptive.entropy_stop", True),
    (["--adaptive-entropy-topk", "4"], "adaptive.entropy_topk", 4),
    (["--adaptive-entropy-threshold", "0.2"], "adaptive.entropy_threshold", 0.2),
    (["--adaptive-entropy-scale", "0.3"], "adaptive.entropy_scale", 0.3),
    (["--confidence-accept-margin", "0.5"], "relaxed.margin", 0.5),
    (["--eagle-relaxed-accept-topk", "3"], "relaxed.topk", 3),
    (["--confidence-accept-from-position", "1"], "relaxed.from_position", 1),
    (["--confidence-accept-after-tokens", "4"], "relaxed.after_tokens", 4),
    (["--confidence-protected-token-ids", "2,5"], "relaxed.protected_token_ids", (2, 5)),
]


@pytest.mark.parametrize("args,key,expected", OLD_NAMES, ids=[args[0] for args, _, _ in OLD_NAMES])
def test_old_flag_names_still_work_and_are_hidden(capsys, args, key, expected):
    assert flatten(serve_spec(capsys, *args))[key] == expected
    assert args[0] not in visible_options(click_command("serve"))


def test_an_old_and_a_new_name_for_one_field_are_refused(capsys):
    result = run_cli(capsys, "serve", BASE_PRESET, "--relaxed-margin", "0.3", "--confidence-accept-margin", "0.4",
                     "--dry-run")
    assert result.exit_code == 2 and "relaxed.margin is given twice" in result.stderr


def test_literal_choices_are_listed_in_the_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    help_text = " ".join(run_cli(capsys, "serve", "--help").stdout.split())
    assert "One of: online, profile, fixed, table, sweep." in help_text
    assert "One of: ngram, draft, eagle, eagle3, none." in help_text


@pytest.mark.parametrize("command", [("serve",), ("bench",), ("profile", "collect")], ids=" ".join)
def test_help_at_80_columns_shows_every_option_name_uncut(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli(capsys, *command, "--help")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    for name in visible_options(click_command(*command)):
        if name.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.stdout), f"{name} is cut or missing"


@pytest.mark.parametrize("item,message", [
    ("adaptive.trace", "expected KEY=VALUE"),
    ("adaptive.bogus=1", "adaptive.bogus: unknown key"),
    ("gamma=3", "its own flag, --gamma"),
    ("adaptive.entropy_topk=1", "adaptive.entropy_topk: got 1"),
    ("adaptive.seed=abc", "adaptive.seed: got 'abc'"),
    ("adaptive.gamma0_mode=never", "adaptive.gamma0_mode: got 'never'"),
])
def test_a_bad_set_is_exit_2_with_one_line(capsys, item, message):
    result = run_cli(capsys, "serve", BASE_PRESET, "--set", item, "--dry-run")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


def test_set_is_repeatable(capsys):
    flat = flatten(serve_spec(capsys, "--set", "adaptive.seed=3", "--set", "adaptive.gamma0_mode=sync"))
    assert (flat["adaptive.seed"], flat["adaptive.gamma0_mode"]) == (3, "sync")
