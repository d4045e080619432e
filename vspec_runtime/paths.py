"""Where vspec keeps things (shared by the CLI and the runtime). XDG folders by default; VSPEC_HOME or per-item variables override."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from vspec_runtime import envs


def _home() -> Path | None:
    home = envs.get("VSPEC_HOME")
    return Path(str(home)).expanduser() if home else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir("vspec"))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir("vspec"))


def model_dir() -> Path:
    override = envs.get("VSPEC_MODEL_DIR")
    return Path(str(override)).expanduser() if override else data_dir() / "models"


def shared_model_dirs() -> list[Path]:
    raw = str(envs.get("VSPEC_SHARED_MODEL_DIRS", ""))
    return [Path(part).expanduser() for part in raw.split(os.pathsep) if part]


def registry_file() -> Path:
    override = envs.get("VSPEC_REGISTRY")
    return Path(str(override)).expanduser() if override else config_dir() / "models.json"


def state_file() -> Path:
    override = envs.get("VSPEC_STATE_FILE")
    return Path(str(override)).expanduser() if override else config_dir() / "state.toml"
