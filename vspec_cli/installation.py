"""What is installed where: the vspec copies this interpreter sees, and the vLLM servers running.

`vspec status` reports it; `vspec enable`/`disable` and the lifecycle (vspec_cli/lifecycle.py) say
from it what needs a restart, and the lifecycle checks with it what pip really installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class InstalledCopy:
    version: str
    location: str
    editable: bool
    here: bool  # inside this interpreter's environment (sys.prefix); pip may change it


def environment_dirs() -> list[Path]:
    """This interpreter's own site-packages folders: the only ones vspec's lifecycle may change."""
    found = []
    for key in ("purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key]).resolve()
        if folder not in found:
            found.append(folder)
    return found


def visible_copies() -> list[InstalledCopy]:
    """Every vspec distribution this interpreter can see, in sys.path order."""
    own = environment_dirs()
    copies = []
    seen = set()
    for entry in sys.path:
        if not entry:
            continue  # `python -c`'s working directory: vLLM servers started elsewhere do not see it
        folder = Path(entry).resolve()
        if folder in seen or not folder.is_dir():
            continue
        seen.add(folder)
        for dist in metadata.distributions(path=[str(folder)]):
            if (dist.metadata["Name"] or "").lower() != "vspec":
                continue
            copies.append(InstalledCopy(dist.version, str(folder), _is_editable(dist), folder in own))
    return copies


def installed_here() -> Optional[InstalledCopy]:
    return next((copy for copy in visible_copies() if copy.here), None)


def _is_editable(dist: metadata.Distribution) -> bool:
    import json

    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except ValueError:
        return False


def running_vllm_servers() -> list[dict]:
    """vLLM processes on this host (Linux /proc); listed so the user knows what needs a restart."""
    proc = Path("/proc")
    found = []
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [arg.decode(errors="replace") for arg in argv if arg]
        if not words:
            continue
        if _is_vllm_server(words):
            found.append({"pid": int(entry.name), "command": " ".join(words)[:160]})
    return found


def _is_vllm_server(words: list[str]) -> bool:
    """`vllm serve ...`, `python .../vllm serve ...` or `python -m vllm.entrypoints...`."""
    if Path(words[0]).name == "vllm":
        return words[1:2] == ["serve"]
    if len(words) > 2 and Path(words[1]).name == "vllm":
        return words[2] == "serve"
    return len(words) > 2 and words[1] == "-m" and words[2].startswith("vllm.entrypoints")


def restart_notice(servers: list[dict]) -> str:
    if not servers:
        return "no running vLLM server found; new servers pick this up when they start"
    pids = ", ".join(str(s["pid"]) for s in servers)
    return f"restart needed: running vLLM servers (pid {pids}) keep their old setup; vspec never stops them"
