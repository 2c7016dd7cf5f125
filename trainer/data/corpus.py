"""A TinyStories-like corpus the project generates itself, so the demo and the tests need no download.

Stories come from a small grammar (a character, a place, a few events with dialogue, a moral) and a
small vocabulary, so a 512-piece tokenizer covers them and a tiny model learns them in minutes. Story
lengths follow a log-normal distribution shaped like TinyStories' in tokens (TinyStories: ~170 words,
~200 Gemma tokens): with the project's 512-piece tokenizer (~1.8 tokens a word) a mean near 200
tokens and a long tail past 256 tokens, which the loader splits into windows.
"""

import itertools
import math
import pathlib
import random

from trainer.shared_files import replaced_atomically

SEPARATOR = "<|endoftext|>"

# Log-normal story length in words: median 100, sigma 0.55 -> mean ~113 words, ~200 tokens, ~23% past 256.
_MEDIAN_WORDS = 100
_SIGMA_WORDS = 0.55

_NAMES = ["Lily", "Tom", "Mia", "Ben", "Sue", "Max", "Anna", "Sam", "Lucy", "Tim", "Zoe", "Jack"]
_KINDS = {"girl": "she", "boy": "he", "bunny": "it", "puppy": "it", "bird": "it", "cat": "it"}
_ADJECTIVES = ["little", "happy", "kind", "brave", "curious", "shy", "funny", "small", "big", "sleepy"]
_PLACES = ["park", "garden", "forest", "beach", "house", "school", "farm", "lake", "hill", "town"]
_OBJECTS = ["ball", "box", "kite", "tree", "flower", "cake", "hat", "toy", "boat", "book", "rock", "shell"]
_COLORS = ["red", "blue", "green", "yellow", "pink", "shiny", "soft", "old", "new"]
_ACTIVITIES = ["play", "run", "sing", "dance", "jump", "read", "swim", "draw", "climb", "laugh"]
_FEELINGS = ["happy", "sad", "scared", "excited", "proud", "tired", "surprised", "angry"]
_MORALS = [
    "sharing makes everyone happy",
    "it is good to be kind to others",
    "friends help each other",
    "being brave is not so hard",
    "it is important to say sorry",
    "listening to mom keeps you safe",
    "trying again is the way to learn",
]
_POSSESSIVE = {"she": "her", "he": "his", "it": "its"}


class _Story:
    """One story's cast and setting, so that its sentences talk about the same things."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.name, self.friend = rng.sample(_NAMES, 2)
        self.kind = rng.choice(list(_KINDS))
        self.pronoun = _KINDS[self.kind]
        self.possessive = _POSSESSIVE[self.pronoun]
        self.place = rng.choice(_PLACES)
        self.thing = rng.choice(_OBJECTS)

    def pick(self, words: list[str]) -> str:
        return self.rng.choice(words)

    def opening(self) -> list[str]:
        return [
            self.rng.choice(["Once upon a time, there was", "One day, there was", "There once was"])
            + f" a {self.pick(_ADJECTIVES)} {self.kind} named {self.name}.",
            f"{self.pronoun.capitalize()} loved to {self.pick(_ACTIVITIES)} in the {self.place}.",
        ]

    def event(self) -> list[str]:
        rng, name, pron = self.rng, self.name, self.pronoun
        color, obj = self.pick(_COLORS), self.pick(_OBJECTS)
        events = [
            [
                f"One day, {name} went to the {self.pick(_PLACES)} with {self.friend}.",
                f"They saw a {color} {obj} under a big tree.",
                f'"Look at the {obj}!" said {name}. "Can we {self.pick(_ACTIVITIES)} with it?"',
                f'{self.friend} smiled and said, "Yes, let us {self.pick(_ACTIVITIES)} together."',
            ],
            [
                f"{name} found a {color} {self.thing} near the {self.pick(_PLACES)}.",
                f"{pron.capitalize()} felt very {self.pick(_FEELINGS)} and wanted to keep it.",
                f"But {self.friend} wanted the {self.thing} too, and they began to fight.",
                f"Then {name} said sorry, and they shared the {self.thing}.",
            ],
            [
                f"The sun was warm, and the sky was {self.pick(['blue', 'bright', 'clear'])}.",
                f"{name} and {self.friend} wanted to {self.pick(_ACTIVITIES)} all day.",
                f"Mom said, \"Be careful, and do not go far from the {self.place}.\"",
            ],
            [
                f"Suddenly, {name} saw that {self.possessive} {obj} was gone.",
                f"{pron.capitalize()} was {self.pick(_FEELINGS)} and looked everywhere.",
                f"{self.friend} helped {name} look in the {self.pick(_PLACES)}.",
                f"At last they found the {obj} behind a {self.pick(_COLORS)} {self.pick(_OBJECTS)}.",
            ],
            [
                f"{name} tried to {self.pick(_ACTIVITIES)}, but it was hard.",
                f"{pron.capitalize()} fell down and felt {self.pick(_FEELINGS)}.",
                f'"Do not give up," said {self.friend}. "Try again!"',
                f"{name} tried again, and this time {pron} did it.",
            ],
        ]
        return rng.choice(events)

    def ending(self) -> list[str]:
        return [
            f"In the end, {self.name} and {self.friend} were very {self.pick(['happy', 'proud', 'tired'])}.",
            f"{self.name} learned that {self.pick(_MORALS)}.",
        ]


def _story(rng: random.Random) -> str:
    """A story cut to a log-normal word count at sentence granularity: the first sentence and the
    moral always, the rest of the opening and events while they fit, the closing line if it fits."""
    target_words = round(_MEDIAN_WORDS * math.exp(rng.gauss(0.0, _SIGMA_WORDS)))
    story = _Story(rng)
    first, *rest = story.opening()
    closing, moral = story.ending()
    sentences, words = [first], len(first.split()) + len(moral.split())
    for sentence in itertools.chain(rest, itertools.chain.from_iterable(iter(story.event, None))):
        if words + len(sentence.split()) > target_words:
            break
        sentences.append(sentence)
        words += len(sentence.split())
    if words + len(closing.split()) <= target_words:
        sentences.append(closing)
    return " ".join(sentences + [moral])


def write_corpus(path, *, num_stories: int, seed: int = 0) -> pathlib.Path:
    """Writes `num_stories` stories to `path`, each followed by a line holding SEPARATOR (the
    TinyStories text format). The same seed writes the same file."""
    rng = random.Random(seed)
    path = pathlib.Path(path)
    with replaced_atomically(path) as temporary, temporary.open("w", encoding="utf-8") as out:
        for _ in range(num_stories):
            out.write(f"{_story(rng)}\n{SEPARATOR}\n")
    return path
