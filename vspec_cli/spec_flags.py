"""Spec flags: the command-line options that set RuntimeSpec fields, derived from the spec itself.

Naming rule: a field's flag is its dotted spec key, dots and underscores written as dashes.

* top-level field ``f``:  ``--f``                (``gamma`` -> ``--gamma``, ``target_model`` -> ``--target-model``)
* ``section.field``:      ``--section-field``    (``adaptive.min_gamma`` -> ``--adaptive-min-gamma``,
                                                 ``relaxed.margin`` -> ``--relaxed-margin``)
* the one exception, ``serving.field``: ``--field`` (``serving.max_model_len`` -> ``--max-model-len``): that
  section mirrors `vllm serve`'s own flags, and users know those names from vLLM.
* a bool field is ``--name/--no-name``.

Help comes from the field's ``description``; a ``Literal`` field's choices are listed there and offered by
shell completion. Click only converts the type (int, float); ranges and choices are judged by the spec,
so a flag, a preset and a config file fail with the same one-line message.

Fields few people touch (RARE_KEYS) and fields holding lists or tables have no flag of their own: they
are set with ``--set section.field=value`` (repeatable, checked against the spec before anything runs),
which keeps ``vspec serve --help`` readable at 80 columns; a command offering --set shows the keys with
``set_fields_help(scope)`` as its epilog. Names used by earlier versions stay accepted as hidden options
(LEGACY_FLAGS).

A command opts in with ``@spec_flags(scope)``. The decorator hands Typer a signature made of the command's
own parameters plus one ``Annotated[..., typer.Option(...)]`` per field in scope, and calls the command
with ``spec_overrides``: the nested dict of the spec fields given on the command line, ready for
``resolve_spec`` (precedence preset < config < flags stays one dict merge).
"""

from __future__ import annotations

import functools
import inspect
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Optional, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from rich.markup import escape

from vspec_cli._errors import UserInputError
from vspec_runtime.spec import RuntimeSpec, layer_problem

SpecOverrides = dict[str, Any]
"""Nested spec keys -> values, only for what was given: {"gamma": 3, "adaptive": {"min_gamma": 1}}."""

SET_OPTION = "--set"
SECTIONS_WITH_VLLM_NAMES = ("serving",)

PANELS = {"": "Speculation", "adaptive": "Adaptive controller",
          "relaxed": "Relaxed acceptance (changes outputs)", "serving": "Serving"}
# The controller's tuning knobs get a panel of their own: beside --no-adaptive-enabled, names as long as
# --adaptive-online-exploration leave Rich too little room at 80 columns, and it cuts option names.
TUNING_PANEL = "Adaptive controller tuning"
SET_PANEL = "Other spec fields"

# Scalar fields that get no flag of their own: reached with --set (see the module docstring).
RARE_KEYS = frozenset({
    "version",
    "adaptive.model_guided", "adaptive.batch_acceptance", "adaptive.token_costs", "adaptive.coverage_weighting",
    "adaptive.acceptance_model", "adaptive.visit_value", "adaptive.firm_up_follow_through",
    "adaptive.batch_normalized_costs",
    "adaptive.start_gamma",
    "adaptive.gamma0_mode", "adaptive.gamma0_reprobe_steps", "adaptive.fixed_gamma",
    "adaptive.seed",
    "adaptive.trace", "adaptive.samples",
    "adaptive.per_request",  # a second long --x/--no-x pair in the panel cuts option names at 80 columns
    "adaptive.entropy_stop", "adaptive.entropy_topk", "adaptive.entropy_threshold", "adaptive.entropy_scale",
    "relaxed.from_position", "relaxed.after_tokens",
})

# Spec fields that hold a file path: typed Path on the command line for the shell's file completion;
# the spec keeps plain strings so its JSON stays simple.
PATH_KEYS = frozenset({"adaptive.profile", "adaptive.trace", "adaptive.samples"})

# Option declarations of earlier versions -> spec key. Hidden from --help, still accepted.
LEGACY_FLAGS: dict[str, str] = {
    "--adaptive-speculation/--no-adaptive-speculation": "adaptive.enabled",
    "--adaptive-trace": "adaptive.trace",
    "--adaptive-entropy-stop/--no-adaptive-entropy-stop": "adaptive.entropy_stop",
    "--adaptive-entropy-topk": "adaptive.entropy_topk",
    "--adaptive-entropy-threshold": "adaptive.entropy_threshold",
    "--adaptive-entropy-scale": "adaptive.entropy_scale",
    "--confidence-accept-margin": "relaxed.margin",
    "--eagle-relaxed-accept-topk": "relaxed.topk",
    "--confidence-accept-from-position": "relaxed.from_position",
    "--confidence-accept-after-tokens": "relaxed.after_tokens",
    "--confidence-protected-token-ids": "relaxed.protected_token_ids",
}


@dataclass(frozen=True)
class SpecField:
    """One leaf field of RuntimeSpec."""

    key: str  # dotted: "gamma", "adaptive.min_gamma"
    annotation: Any
    description: str

    @property
    def section(self) -> str:
        return self.key.rpartition(".")[0]

    @property
    def value_type(self) -> Optional[type]:
        """The Python type of a single-token value (Literal -> str); None for lists and tables."""
        base = _without_none(self.annotation)
        if get_origin(base) is Literal:
            return type(get_args(base)[0])
        return base if base in (bool, int, float, str) else None

    @property
    def choices(self) -> tuple[Any, ...]:
        base = _without_none(self.annotation)
        return get_args(base) if get_origin(base) is Literal else ()

    @property
    def has_flag(self) -> bool:
        return self.value_type is not None and self.key not in RARE_KEYS


def _without_none(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


@functools.cache
def all_spec_fields() -> dict[str, SpecField]:
    """Every leaf field of RuntimeSpec by dotted key, sections expanded, in declaration order."""
    fields: dict[str, SpecField] = {}
    for name, info in RuntimeSpec.model_fields.items():
        if _is_section(info.annotation):
            for sub, sub_info in info.annotation.model_fields.items():
                key = f"{name}.{sub}"
                fields[key] = SpecField(key, sub_info.annotation, sub_info.description or "")
        else:
            fields[name] = SpecField(name, info.annotation, info.description or "")
    return fields


def flag_name(key: str) -> str:
    """The flag of a spec key under the naming rule (module docstring)."""
    section, _, field = key.rpartition(".")
    words = field if section in ("", *SECTIONS_WITH_VLLM_NAMES) else f"{section}_{field}"
    return "--" + words.replace("_", "-")


# --- scopes: which fields a command takes -------------------------------------------------------
ALL_FIELDS: tuple[str, ...] = tuple(all_spec_fields())
MODEL_FIELDS = ("method", "target_model", "drafter", "gamma", "ngram_min", "ngram_max")
ENGINE_FIELDS = ("serving.device", "serving.max_num_seqs", "serving.max_model_len",
                 "serving.max_num_batched_tokens", "serving.dtype", "serving.gpu_memory_utilization")
ADAPTIVE_TUNING_FIELDS = ("adaptive.min_gamma", "adaptive.max_gamma_step", "adaptive.control_interval",
                          "adaptive.hysteresis", "adaptive.online_window", "adaptive.online_exploration")


# --- building the options -----------------------------------------------------------------------
def _completer(words: Iterable[str]) -> Callable[[str], list[str]]:
    candidates = [str(word) for word in words]

    def complete(incomplete: str) -> list[str]:
        return [word for word in candidates if word.startswith(incomplete)]

    return complete


def _help(field: SpecField) -> str:
    text = field.description
    if field.choices:
        text += " One of: " + ", ".join(map(str, field.choices)) + "."
    return escape(text)  # Typer renders help as Rich markup; a '[' in a description is text


def _cli_type(field: SpecField) -> type:
    return Path if field.key in PATH_KEYS else field.value_type or str


def _declaration(name: str, field: SpecField) -> str:
    return f"{name}/--no-{name.removeprefix('--')}" if field.value_type is bool else name


def _param_name(prefix: str, text: str) -> str:
    return prefix + text.split("/")[0].removeprefix("--").replace("-", "_").replace(".", "__")


def _panel(field: SpecField) -> str:
    return TUNING_PANEL if field.key in ADAPTIVE_TUNING_FIELDS else PANELS[field.section]


def _flag_parameter(field: SpecField) -> inspect.Parameter:
    option = typer.Option(_declaration(flag_name(field.key), field), help=_help(field), show_default=False,
                          rich_help_panel=_panel(field),
                          autocompletion=_completer(field.choices) if field.choices else None)
    return inspect.Parameter(_param_name("spec_flag__", field.key), inspect.Parameter.KEYWORD_ONLY,
                             default=None, annotation=Annotated[Optional[_cli_type(field)], option])


def _legacy_parameter(declaration: str, field: SpecField) -> inspect.Parameter:
    # A list arrives as one comma-separated string, as it always did (str is _cli_type's fallback);
    # overrides_from_given reads it the way --set does.
    option = typer.Option(declaration, hidden=True)
    return inspect.Parameter(_param_name("legacy_flag__", declaration), inspect.Parameter.KEYWORD_ONLY,
                             default=None, annotation=Annotated[Optional[_cli_type(field)], option])


def _set_parameter(keys: list[str]) -> inspect.Parameter:
    option = typer.Option(SET_OPTION, metavar="KEY=VALUE", show_default=False, rich_help_panel=SET_PANEL,
                          help="Set a spec field that has no flag (repeatable); the keys are listed below.",
                          autocompletion=_completer(f"{key}=" for key in keys))
    return inspect.Parameter("spec_set_items", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[list[str]], option])


@dataclass(frozen=True)
class _Plan:
    """The spec options of one command."""

    options: dict[str, tuple[str, str]]  # parameter name -> (spec key, the option as typed: "--gamma")
    own_flags: dict[str, str]  # spec key -> its visible flag
    set_keys: list[str]  # keys only --set reaches

    def parameter_names(self) -> list[str]:
        return [*self.options, *(["spec_set_items"] if self.set_keys else [])]


def _plan(scope: tuple[str, ...]) -> tuple[_Plan, list[inspect.Parameter]]:
    fields = all_spec_fields()
    wanted = [fields[key] for key in scope]  # a KeyError here is a typo in a command's scope
    parameters: list[inspect.Parameter] = []
    options: dict[str, tuple[str, str]] = {}
    for field in (f for f in wanted if f.has_flag):
        parameters.append(_flag_parameter(field))
        options[parameters[-1].name] = (field.key, flag_name(field.key))
    for declaration, key in LEGACY_FLAGS.items():
        if key in scope:
            parameters.append(_legacy_parameter(declaration, fields[key]))
            options[parameters[-1].name] = (key, declaration.split("/")[0])
    set_keys = [field.key for field in wanted if not field.has_flag]
    if set_keys:
        parameters.append(_set_parameter(set_keys))
    own_flags = {field.key: flag_name(field.key) for field in wanted if field.has_flag}
    return _Plan(options, own_flags, set_keys), parameters


def set_fields_help(scope: Iterable[str]) -> str:
    """A help section listing the fields of ``scope`` that only --set reaches, with their descriptions."""
    fields = all_spec_fields()
    rare = [fields[key] for key in scope if not fields[key].has_flag]
    if not rare:
        return ""
    lines = [f"  [bold]{field.key}[/bold]: {_help(field)}" for field in rare]
    return "\n[bold]Fields for --set KEY=VALUE[/bold] (lists: 1,2,3; tables: {1=6, 8=1})\n\n" + "\n".join(lines) + "\n"


# --- reading what was given ----------------------------------------------------------------------
def parse_set_value(field: SpecField, text: str) -> Any:
    """A --set value in the field's terms; the spec judges it afterwards.

    Text fields take the text as is ('0,1' stays a device list). Lists take '1,2,3' or '[1, 2, 3]'.
    Everything else is read as a TOML value (true, 3, 0.5, {1 = 6}), so it means what it would in a
    config file; what TOML cannot read goes to the spec as text, which then names the field and the value.
    """
    if field.value_type is str or field.key in PATH_KEYS:
        return text
    if get_origin(_without_none(field.annotation)) is tuple and not text.lstrip().startswith("["):
        return [part.strip() for part in text.split(",") if part.strip()]
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def _parse_set_item(item: str, plan: _Plan) -> tuple[str, Any]:
    key, equals, text = item.partition("=")
    key = key.strip()
    if not equals or not key:
        raise UserInputError(f"{SET_OPTION} '{item}': expected KEY=VALUE, e.g. adaptive.trace=trace.jsonl")
    if key in plan.own_flags:  # one way to set each field, so a command line reads one way
        raise UserInputError(f"{SET_OPTION} {key}: this field has its own flag, {plan.own_flags[key]}")
    if key not in plan.set_keys:
        raise UserInputError(f"{SET_OPTION} {key}: unknown key; the keys are listed in --help")
    value = parse_set_value(all_spec_fields()[key], text)
    problem = layer_problem(_nested({key: value}), SET_OPTION)  # name --set, not "command-line flags"
    if problem:
        raise UserInputError(problem)
    return key, value


def _nested(flat: dict[str, Any]) -> SpecOverrides:
    nested: SpecOverrides = {}
    for key, value in flat.items():
        *sections, leaf = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = str(value) if isinstance(value, Path) else value
    return nested


def overrides_from_given(plan: _Plan, given: dict[str, Any]) -> SpecOverrides:
    """The nested overrides from the spec options Typer parsed (None means 'not given')."""
    flat: dict[str, Any] = {}
    given_as: dict[str, str] = {}

    def put(key: str, value: Any, how: str) -> None:
        if key in flat:  # two spellings of one field: refuse rather than pick one silently
            raise UserInputError(f"{key} is given twice ({given_as[key]} and {how}); give it once")
        flat[key], given_as[key] = value, how

    for name, (key, how) in plan.options.items():
        value = given.get(name)
        if value is None:
            continue
        if isinstance(value, str) and all_spec_fields()[key].value_type is None:
            value = parse_set_value(all_spec_fields()[key], value)  # a legacy flag's comma-separated list
        put(key, value, how)
    for item in given.get("spec_set_items") or ():
        key, value = _parse_set_item(item, plan)
        put(key, value, f"{SET_OPTION} {key}")
    return _nested(flat)


def spec_flags(scope: Iterable[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a Typer command one option per spec field in ``scope`` (plus --set for the rest).

    The command declares a keyword-only ``spec_overrides: SpecOverrides`` parameter and gets the given
    fields there, nested. Its other parameters stay as declared, in front of the spec options.
    """
    scope = tuple(scope)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        plan, spec_parameters = _plan(scope)
        own = inspect.signature(command, eval_str=True)
        if "spec_overrides" not in own.parameters:
            raise TypeError(f"{command.__name__} must take a keyword-only 'spec_overrides' parameter")
        names = plan.parameter_names()

        @functools.wraps(command)
        def with_spec_flags(**values: Any) -> Any:
            given = {name: values.pop(name) for name in names}
            return command(**values, spec_overrides=overrides_from_given(plan, given))

        # Typer reads the command's options from this signature (public: inspect.signature honours it).
        kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()
                if p.name != "spec_overrides"]
        parameters = kept + spec_parameters
        with_spec_flags.__signature__ = own.replace(parameters=parameters)
        with_spec_flags.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_spec_flags

    return decorate
