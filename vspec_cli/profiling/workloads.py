"""Prompts for a collect run. Any text on the machine will do; these need no download.

``copy``   reproduce a passage of Python's own documentation: n-gram drafts find matches and K runs
           at full length, so every step verifies B*(K+1) tokens and the whole n range is measured.
``open``   open questions: drafts rarely match, acceptance is low (the latency still depends on the
           K drafted, which is what the fit needs).
``mixed``  alternating copy and open prompts.

Step latency depends on K, the batch and the context, not on what the text says; the workload
matters for how often the n-gram drafter finds a match (and so how many tokens a step verifies)
and for the measured batch-size -> K prior, whose workload the profile records.
"""

from __future__ import annotations

import importlib
import inspect

from vspec_cli._errors import UserInputError

# Stdlib modules whose docstrings are long prose; imported only to read them.
_PASSAGE_MODULES = (
    "argparse", "json", "csv", "heapq", "difflib", "tempfile", "unittest", "typing", "http.server",
    "collections", "subprocess", "sqlite3", "random", "statistics", "doctest", "ftplib", "smtplib", "pdb",
)
_PASSAGE_CHARS = 700

_OPEN_QUESTIONS = (
    "Why do some cities grow faster than others? Give several reasons.",
    "Describe a day in the life of a lighthouse keeper in the nineteenth century.",
    "What would change if humans could photosynthesise?",
    "Explain how a bicycle stays upright while moving.",
    "Write a short story about a robot that learns to paint.",
    "What are the arguments for and against a four-day working week?",
    "Invent a new board game and explain its rules.",
    "How might people travel between cities in the year 2200?",
    "Describe the taste of a fruit that does not exist.",
    "What makes a good teacher? Discuss with examples.",
    "Write a letter from a cat to its owner about the new dog.",
    "Why is the sky dark at night if there are so many stars?",
    "Plan a week-long trip through a country you have never visited.",
    "What are the hardest problems in building a city on Mars?",
    "Tell the history of a small village through the eyes of its oldest tree.",
    "Compare living by the sea with living in the mountains.",
)

WORKLOADS = ("copy", "open", "mixed")


def _passage(module_name: str) -> str:
    text = inspect.getdoc(importlib.import_module(module_name)) or ""
    if len(text) <= _PASSAGE_CHARS:
        return text
    cut = text.rfind("\n", 0, _PASSAGE_CHARS)
    return text[: cut if cut > _PASSAGE_CHARS // 2 else _PASSAGE_CHARS]


def copy_prompts(count: int) -> list[str]:
    passages = [_passage(name) for name in _PASSAGE_MODULES]
    return [
        f"Copy the following text exactly, word for word:\n\n{passages[i % len(passages)]}"
        for i in range(count)
    ]


def open_prompts(count: int) -> list[str]:
    return [_OPEN_QUESTIONS[i % len(_OPEN_QUESTIONS)] for i in range(count)]


def prompts(workload: str, count: int) -> list[str]:
    """``count`` prompts of ``workload`` (deterministic: the same call gives the same prompts)."""
    if workload == "copy":
        return copy_prompts(count)
    if workload == "open":
        return open_prompts(count)
    if workload == "mixed":
        copies, opens = copy_prompts(count), open_prompts(count)
        return [copies[i] if i % 2 == 0 else opens[i] for i in range(count)]
    raise UserInputError(f"--workload: got '{workload}'; choose one of {', '.join(WORKLOADS)}")


def longest_prompt_chars(workload: str, count: int) -> int:
    return max(len(p) for p in prompts(workload, count))
