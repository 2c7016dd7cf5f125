"""What a run makes of its --data and --tokenizer (trainer.loop.resolve_inputs): the tiny preset trains
a tokenizer that the user's data supports, and a run loads its tokenizer once."""

import json
import random

import pytest

from trainer import loop
from trainer.config import parse_config
from trainer.data import tokenizer as tokenizer_lib

# A user's first try: a few hundred conversations over a vocabulary of a few dozen words, which holds
# fewer merges than the tiny preset's 512 pieces (SentencePiece refused it: "Vocabulary size too high").
SMALL_CHAT_CONVERSATIONS = 300
_WORDS = "the cat dog sat ran on a mat red blue big small yes no hi".split()


@pytest.fixture
def small_chat_file(tmp_path):
    rng = random.Random(0)
    say = lambda: " ".join(rng.choice(_WORDS) for _ in range(6))  # noqa: E731
    path = tmp_path / "chat.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for _ in range(SMALL_CHAT_CONVERSATIONS):
            messages = [{"role": role, "content": say()} for role in ("user", "assistant", "user", "assistant")]
            out.write(json.dumps({"messages": messages}) + "\n")
    return path


@pytest.fixture
def tokenizer_loads(monkeypatch) -> list[str]:
    """The path of every tokenizer loaded from now on, in order."""
    loads, make = [], tokenizer_lib.Tokenizer

    def counted(**fields):
        loads.append(fields["path"])
        return make(**fields)

    monkeypatch.setattr(tokenizer_lib, "Tokenizer", counted)
    return loads


def test_the_tiny_preset_trains_on_a_small_chat_file_with_a_tokenizer_sized_to_it(tmp_path, small_chat_file):
    workdir = tmp_path / "run"
    config = parse_config(["--preset", "tiny", "--data", str(small_chat_file), "--workdir", str(workdir)])
    inputs = loop.resolve_inputs(config, workdir)
    assert (inputs.data.data_format, inputs.data.documents) == ("jsonl-chat", SMALL_CHAT_CONVERSATIONS)
    tokenizer = inputs.tokenizer
    assert tokenizer.vocab_size < loop.DEMO_VOCAB_SIZE  # as many pieces as the data supports
    assert inputs.data.vocab_size == tokenizer.vocab_size
    answer = "the big dog sat on a red mat"
    assert tokenizer.decode(tokenizer.encode(answer)) == answer
    assert len(tokenizer.encode("<start_of_turn>")) == 1  # a chat tokenizer still: the turn markers are pieces


def test_a_run_loads_its_tokenizer_once(tmp_path, chat_corpus_path, chat_tokenizer_path, tokenizer_loads):
    """The raw file is prepared, then opened, with the tokenizer the run keeps (the official one is read
    from gs://, and every load reads the whole file)."""
    workdir = tmp_path / "run"
    config = parse_config(["--model", "tiny", "--weights", "random", "--data", str(chat_corpus_path),
                           "--tokenizer", str(chat_tokenizer_path), "--workdir", str(workdir)])
    inputs = loop.resolve_inputs(config, workdir)
    assert inputs.data.documents > 0
    assert tokenizer_loads == [str(chat_tokenizer_path)]
