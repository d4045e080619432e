"""The install/enable state file: versioned TOML, comments kept, written atomically under a lock.

The runtime reads only the top-level ``enabled`` key (and an optional ``[runtime]`` table) with
tomllib (vspec_runtime/activation.py); everything else is for `vspec status` and `vspec rollback`.
Operators may edit the file: tomlkit keeps their comments and any keys vspec does not know.
"""

from __future__ import annotations

import datetime as _dt
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import tomlkit
from filelock import FileLock
from tomlkit.exceptions import TOMLKitError

from vspec_cli._errors import PreconditionError
from vspec_cli.atomic import write_text_atomic
from vspec_runtime import paths

STATE_SCHEMA = "vspec-state/1"
HISTORY_LIMIT = 50  # the file must not grow without bound

_HEADER = """\
vspec state: written by `vspec install/upgrade/rollback/uninstall/enable/disable`.
enabled = true makes the vspec plugin apply to vLLM servers started with plain `vllm serve`;
`vspec serve` works either way. Comments and unknown keys are kept when vspec rewrites this file."""


@dataclass(frozen=True)
class State:
    enabled: bool = False
    installed_version: Optional[str] = None
    installed_source: Optional[str] = None  # a pip requirement: "wheel:/x.whl", "editable:/src", "index:0.2.0"
    previous_versions: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)  # version -> where it was installed from
    history: tuple[dict, ...] = ()

    def as_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "installed_version": self.installed_version,
            "installed_source": self.installed_source,
            "previous_versions": list(self.previous_versions),
            "sources": dict(self.sources),
            "history": [dict(entry) for entry in self.history],
        }


def state_path(path: Optional[Path] = None) -> Path:
    return path or paths.state_file()


_locks: dict[str, FileLock] = {}


def lock(path: Optional[Path] = None) -> FileLock:
    """One lock object per file and process, so nested use in one command is re-entrant."""
    path = state_path(path)
    key = str(path)
    if key not in _locks:
        path.parent.mkdir(parents=True, exist_ok=True)
        _locks[key] = FileLock(key + ".lock", timeout=60)
    return _locks[key]


def _load_document(path: Path) -> tomlkit.TOMLDocument:
    if not path.exists():
        document = tomlkit.document()
        for line in _HEADER.splitlines():
            document.add(tomlkit.comment(line))
        document.add("schema", STATE_SCHEMA)
        document.add("enabled", False)
        document.add(tomlkit.nl())
        document.add("sources", tomlkit.table())
        return document
    try:
        document = tomlkit.parse(path.read_text(encoding="utf-8"))
    except (TOMLKitError, UnicodeDecodeError) as exc:
        raise PreconditionError(
            f"state file {path} is not valid TOML ({exc}); it was left as it is",
            hint=f"fix or move {path} away, then run `vspec status`",
        ) from None
    schema = document.get("schema", STATE_SCHEMA)
    if schema != STATE_SCHEMA:
        raise PreconditionError(
            f"state file {path} has schema {schema!r}, this vspec understands {STATE_SCHEMA!r}; it was left as it is",
            hint="use the vspec version that wrote it, or move the file away",
        )
    return document


def _to_state(document: tomlkit.TOMLDocument) -> State:
    plain = document.unwrap()
    return State(
        enabled=bool(plain.get("enabled", False)),
        installed_version=plain.get("installed_version"),
        installed_source=plain.get("installed_source"),
        previous_versions=tuple(str(v) for v in plain.get("previous_versions", [])),
        sources={str(k): str(v) for k, v in plain.get("sources", {}).items()},
        history=tuple(plain.get("history", [])),
    )


def read_state(path: Optional[Path] = None) -> State:
    return _to_state(_load_document(state_path(path)))


def read_text(path: Optional[Path] = None) -> Optional[str]:
    """The raw file (None when absent): what a transaction restores on failure."""
    path = state_path(path)
    return path.read_text(encoding="utf-8") if path.exists() else None


def restore_text(text: Optional[str], path: Optional[Path] = None) -> None:
    path = state_path(path)
    with lock(path):
        if text is None:
            path.unlink(missing_ok=True)
        else:
            write_text_atomic(path, text)


@contextmanager
def editing(path: Optional[Path] = None) -> Iterator[tomlkit.TOMLDocument]:
    """Read-modify-write under the lock; the file is replaced atomically only if the body succeeds."""
    path = state_path(path)
    with lock(path):
        document = _load_document(path)
        before = tomlkit.dumps(document)
        yield document
        after = tomlkit.dumps(document).rstrip("\n") + "\n"
        if after != before or not path.exists():
            write_text_atomic(path, after)


def set_values(document: tomlkit.TOMLDocument, **values) -> None:
    """Set top-level keys; None removes the key. Unknown keys and comments are untouched."""
    for key, value in values.items():
        if value is None:
            if key in document:
                del document[key]
        elif isinstance(value, (list, tuple)):
            array = tomlkit.array()
            array.extend(value)
            document[key] = array
        else:
            document[key] = value


def set_source(document: tomlkit.TOMLDocument, version: str, source: str) -> None:
    """Remember where ``version`` came from, editing the [sources] table in place (comments stay)."""
    sources = document.get("sources")
    if sources is None:
        sources = tomlkit.table()
        document["sources"] = sources
    sources[version] = source


def append_history(document: tomlkit.TOMLDocument, action: str, **details) -> None:
    entry = {"at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "action": action}
    entry.update({k: v for k, v in details.items() if v is not None})
    history = document.get("history")
    if history is None:
        history = tomlkit.aot()
        document["history"] = history
    history.append(entry)
    while len(history) > HISTORY_LIMIT:
        del history[0]


def set_enabled(enabled: bool, path: Optional[Path] = None) -> State:
    with editing(path) as document:
        if bool(document.get("enabled", False)) != enabled:
            set_values(document, enabled=enabled)
            append_history(document, "enable" if enabled else "disable")
        state = _to_state(document)
    return state
