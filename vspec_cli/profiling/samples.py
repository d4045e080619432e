"""The samples file the controller writes (vspec_runtime/controller.py ``_write_sample``).

One JSON object per line, one line per verified engine step. Only stable steps are measurements
of a single K: a pure decode step whose verified drafts and new drafts used the same K. Unknown
keys are ignored (the runtime may add fields); missing or ill-typed required ones are errors that
name the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from vspec_cli._errors import UserInputError

_COUNT_KEYS = ("batch_size", "gamma", "context_tokens", "batched_tokens")
_OPTIONAL_COUNT_KEYS = ("drafted", "accepted", "committed")


@dataclass(frozen=True)
class Sample:
    """One verified step."""

    line: int  # 1-based line in the file, for messages
    batch_size: int
    gamma: int  # K that drafted the tokens verified in this step
    stable: bool
    interval_ms: float  # non-overlapping wall time of the step
    context_tokens: int  # context summed over the batch
    batched_tokens: int  # tokens the target processed
    drafted: int = 0
    accepted: int = 0
    committed: int = 0  # accepted + one target token per request


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_sample(data: object, where: str, line: int) -> Sample:
    if not isinstance(data, dict):
        raise UserInputError(f"{where}:{line}: expected a JSON object, got {type(data).__name__}")
    for key in (*_COUNT_KEYS, "interval_ms", "stable"):
        if key not in data:
            raise UserInputError(f"{where}:{line}: missing '{key}' (is this a vspec samples file?)")
    for key in _COUNT_KEYS + tuple(k for k in _OPTIONAL_COUNT_KEYS if k in data):
        if not _is_count(data[key]):
            raise UserInputError(f"{where}:{line}: '{key}' is {data[key]!r}; expected an integer >= 0")
    interval = data["interval_ms"]
    if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not math.isfinite(interval) \
            or interval < 0:
        raise UserInputError(f"{where}:{line}: 'interval_ms' is {interval!r}; expected a finite number >= 0")
    if not isinstance(data["stable"], bool):
        raise UserInputError(f"{where}:{line}: 'stable' is {data['stable']!r}; expected true or false")
    return Sample(
        line=line,
        batch_size=data["batch_size"],
        gamma=data["gamma"],
        stable=data["stable"],
        interval_ms=float(interval),
        context_tokens=data["context_tokens"],
        batched_tokens=data["batched_tokens"],
        drafted=data.get("drafted", 0),
        accepted=data.get("accepted", 0),
        committed=data.get("committed", 0),
    )


def read_samples(path: Path) -> list[Sample]:
    """Every sample in ``path``; blank lines skipped. UserInputError on the first bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"samples file {path} does not exist",
                             hint="run `vspec profile collect` first, or check the path") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserInputError(f"samples file {path} is not readable as text ({type(exc).__name__})") from None
    samples = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        samples.append(parse_sample(data, str(path), number))
    if not samples:
        raise UserInputError(f"samples file {path} is empty",
                             hint="the engine wrote no verified step; check the collect run's log")
    return samples


def usable(samples: list[Sample]) -> list[Sample]:
    """Stable steps with a positive measured interval: the ones a latency fit may use."""
    return [s for s in samples if s.stable and s.batch_size >= 1 and s.interval_ms > 0.0]
