"""A chat corpus the project generates itself, for `--preset tiny-chat` and the tests: JSONL rows of
{"messages": [...]} that a tiny model learns to answer in a few hundred steps.

Three kinds of question, each with one right answer in a fixed form: a greeting ("Hello!" ->
"Hello! How can I help you today?"), the sum of two numbers below 10 ("What is 3 plus 4?" ->
"3 plus 4 is 7."), and the colour of a thing named in the question ("The ball is red and the hat is
blue. What colour is the hat?" -> "The hat is blue."). Some conversations open with a system
message, some hold two questions, some say "assistant" where others say "model".
"""

import json
import pathlib
import random

from trainer.shared_files import replaced_atomically

# What --preset tiny-chat's samples ask: one question of each kind the corpus holds.
SAMPLE_PROMPTS = ("Hello!", "What is 3 plus 4?", "The kite is green and the boat is pink. What colour is the boat?")

_GREETINGS = ["Hello!", "Hi!", "Hello there!", "Good morning!", "Hi, how are you?"]
_GREETING_ANSWER = "Hello! How can I help you today?"
_SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer in one short sentence.", "You are a friendly tutor."]
_THINGS = ["ball", "hat", "kite", "boat", "cake", "book", "shell", "flower", "box", "cup"]
_COLOURS = ["red", "blue", "green", "yellow", "pink", "white", "black", "orange"]
_SYSTEM_SHARE, _TWO_QUESTIONS_SHARE, _ASSISTANT_SHARE = 0.3, 0.25, 0.5


def _question(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(("greeting", "sum", "sum", "colour", "colour"))
    if kind == "greeting":
        return rng.choice(_GREETINGS), _GREETING_ANSWER
    if kind == "sum":
        a, b = rng.randrange(10), rng.randrange(10)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    first, second = rng.sample(_THINGS, 2)
    colour_of = dict(zip((first, second), rng.sample(_COLOURS, 2)))
    asked = rng.choice((first, second))
    return (f"The {first} is {colour_of[first]} and the {second} is {colour_of[second]}. What colour is the {asked}?",
            f"The {asked} is {colour_of[asked]}.")


def conversation(rng: random.Random) -> list[dict[str, str]]:
    model = "assistant" if rng.random() < _ASSISTANT_SHARE else "model"
    messages = [{"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)}] if rng.random() < _SYSTEM_SHARE else []
    for _ in range(2 if rng.random() < _TWO_QUESTIONS_SHARE else 1):
        question, answer = _question(rng)
        messages += [{"role": "user", "content": question}, {"role": model, "content": answer}]
    return messages


def write_chat_corpus(path, *, num_conversations: int, seed: int = 0) -> pathlib.Path:
    """Writes `num_conversations` JSONL chat rows to `path`. The same seed writes the same file."""
    rng = random.Random(seed)
    path = pathlib.Path(path)
    with replaced_atomically(path) as temporary, temporary.open("w", encoding="utf-8") as out:
        for _ in range(num_conversations):
            out.write(json.dumps({"messages": conversation(rng)}) + "\n")
    return path
