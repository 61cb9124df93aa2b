"""Prompt sets for EAGLE self-distillation and for measuring acceptance (disjoint topics)."""

from __future__ import annotations

_TEMPLATES = [
    "Explain {} in simple terms.",
    "Write a short story about {}.",
    "List five interesting facts about {}.",
    "Write a Python function that has something to do with {}, with a docstring.",
    "What are the pros and cons of {}?",
    "Describe {} to a ten-year-old.",
]

TRAIN_TOPICS = [
    "the ocean", "volcanoes", "a lost robot", "coffee", "the moon", "bicycles",
    "photosynthesis", "a dragon who cannot fly", "the stock market", "sorting a list",
    "rainforests", "electric cars", "a haunted library", "honey bees", "chess",
    "the internet", "glaciers", "a time traveller", "bread baking", "prime numbers",
    "deserts", "music festivals", "a talking cat", "solar panels", "the Roman empire",
    "parsing JSON", "mountains", "friendship", "recycling", "black holes",
]  # fmt: skip

HELDOUT_TOPICS = ["penguins", "a rainy city", "compound interest", "reading CSV files"]


def chat_prompts(topics: list[str]) -> list[str]:
    """One user message per (template, topic)."""
    return [t.format(topic) for topic in topics for t in _TEMPLATES]


def train_prompts() -> list[str]:
    """180 distillation prompts."""
    return chat_prompts(TRAIN_TOPICS)


def heldout_prompts() -> list[str]:
    """24 prompts on topics absent from the training set."""
    return chat_prompts(HELDOUT_TOPICS)
