"""Shared trainer fixtures: one generated corpus, tokenizer and prepared dataset per test session.

Built with the trainer's own data functions (no downloads), once, in a session tmp dir, so every
trainer test (data, metrics, core) reads the same small, deterministic inputs.
"""

import pathlib

import pytest

# Small enough to build in a few seconds on 2 CPU cores, large enough for a few packed batches
# and a held-out eval split.
NUM_STORIES = 400
VOCAB_SIZE = 512


@pytest.fixture(scope="session")
def trainer_inputs_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("trainer_inputs")


@pytest.fixture(scope="session")
def corpus_path(trainer_inputs_dir) -> pathlib.Path:
    """A raw text corpus: stories separated by `trainer.data.corpus.SEPARATOR`."""
    from trainer.data.corpus import write_corpus

    return write_corpus(trainer_inputs_dir / "corpus.txt", num_stories=NUM_STORIES, seed=0)


@pytest.fixture(scope="session")
def tokenizer_path(trainer_inputs_dir, corpus_path) -> pathlib.Path:
    """A SentencePiece model trained on the corpus (PAD 0, EOS 1, BOS 2, UNK 3)."""
    from trainer.data.tokenizer import train_tokenizer

    return train_tokenizer(corpus_path, trainer_inputs_dir / "tokenizer.model", vocab_size=VOCAB_SIZE, seed=0)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    """The corpus's tokenizer, loaded (`trainer.data.tokenizer.Tokenizer`)."""
    from trainer.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="session")
def prepared_dir(trainer_inputs_dir, corpus_path, tokenizer) -> pathlib.Path:
    """The corpus tokenized into sharded ArrayRecord files plus meta.json (`trainer.data.prepare`)."""
    from trainer.data.prepare import prepare

    output_dir = trainer_inputs_dir / "prepared"
    prepare(corpus_path, tokenizer, output_dir)
    return output_dir


@pytest.fixture(scope="session")
def tokenized_data(prepared_dir, tokenizer, trainer_inputs_dir):
    """`trainer.data.loader.TokenizedData` opened from the prepared directory."""
    from trainer.data.loader import open_data

    return open_data(str(prepared_dir), tokenizer=tokenizer, cache_dir=str(trainer_inputs_dir / "cache"))


# Conversations of the generated chat corpus (trainer.data.chat_corpus): ~35 tokens each.
NUM_CONVERSATIONS = 300


@pytest.fixture(scope="session")
def chat_corpus_path(trainer_inputs_dir) -> pathlib.Path:
    """JSONL chat rows ({"messages": [...]}, a system message in some)."""
    from trainer.data.chat_corpus import write_chat_corpus

    return write_chat_corpus(trainer_inputs_dir / "chat.jsonl", num_conversations=NUM_CONVERSATIONS, seed=0)


@pytest.fixture(scope="session")
def chat_tokenizer_path(trainer_inputs_dir, chat_corpus_path) -> pathlib.Path:
    """A SentencePiece model trained for chat: <start_of_turn> and <end_of_turn> are single pieces."""
    from trainer.data.tokenizer import train_tokenizer

    return train_tokenizer(chat_corpus_path, trainer_inputs_dir / "chat_tokenizer.model", vocab_size=VOCAB_SIZE, seed=0)


@pytest.fixture(scope="session")
def chat_tokenizer(chat_tokenizer_path):
    from trainer.data.tokenizer import load_tokenizer

    return load_tokenizer(chat_tokenizer_path)


@pytest.fixture(scope="session")
def chat_prepared_dir(trainer_inputs_dir, chat_corpus_path, chat_tokenizer) -> pathlib.Path:
    """The chat corpus prepared with loss on completions (records carry their loss mask)."""
    from trainer.data.prepare import prepare

    output_dir = trainer_inputs_dir / "chat_prepared"
    prepare(chat_corpus_path, chat_tokenizer, output_dir)
    return output_dir


@pytest.fixture(scope="session")
def chat_data(chat_prepared_dir, chat_tokenizer, trainer_inputs_dir):
    from trainer.data.loader import open_data

    return open_data(str(chat_prepared_dir), tokenizer=chat_tokenizer, cache_dir=str(trainer_inputs_dir / "cache"))
