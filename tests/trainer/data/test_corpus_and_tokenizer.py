"""The generated corpus looks like TinyStories to the loader; the tokenizer has Gemma's special ids."""

import json
import random

import numpy as np
import pytest

from trainer.data.corpus import SEPARATOR, write_corpus
from trainer.errors import UserError
from trainer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_tokenizer, train_tokenizer


def _documents(path):
    return [d.strip() for d in path.read_text().split(SEPARATOR) if d.strip()]


def test_same_seed_writes_the_same_corpus_and_another_seed_another(tmp_path):
    first = write_corpus(tmp_path / "a.txt", num_stories=20, seed=3).read_bytes()
    again = write_corpus(tmp_path / "b.txt", num_stories=20, seed=3).read_bytes()
    other = write_corpus(tmp_path / "c.txt", num_stories=20, seed=4).read_bytes()
    assert first == again
    assert first != other
    assert first.count(SEPARATOR.encode()) == 20


def test_story_lengths_are_tinystories_like(corpus_path, tokenizer_path):
    tokenizer = load_tokenizer(tokenizer_path)
    tokens = np.array([len(ids) + 1 for ids in tokenizer.encode_batch(_documents(corpus_path))])
    print(f"tokens per story: mean {tokens.mean():.0f}, median {np.median(tokens):.0f}, "
          f"past 256: {np.mean(tokens > 256):.0%}, min {tokens.min()}, max {tokens.max()}")
    assert 170 <= tokens.mean() <= 230
    assert 0.1 <= np.mean(tokens > 256) <= 0.4  # the long tail the loader must window
    assert np.mean(tokens < 100) >= 0.05  # short stories that fill packed rows


def test_tokenizer_has_gemma_special_ids_and_round_trips_unseen_text(tokenizer_path):
    tokenizer = load_tokenizer(tokenizer_path)
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (PAD_ID, EOS_ID, BOS_ID)
    assert tokenizer.processor.unk_id() == UNK_ID
    assert tokenizer.vocab_size == 512
    text = "Lily met a dragon named Größe 🐉 in the park."
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids  # byte fallback: characters never seen in training still encode
    assert tokenizer.decode(ids) == text


def test_tokenizer_training_is_deterministic(tmp_path, corpus_path, tokenizer_path):
    again = train_tokenizer(corpus_path, tmp_path / "again.model", vocab_size=512, seed=0)
    assert again.read_bytes() == tokenizer_path.read_bytes()


def test_load_tokenizer_names_a_missing_or_non_sentencepiece_file(tmp_path):
    with pytest.raises(UserError, match="missing.model: file not found"):
        load_tokenizer(tmp_path / "missing.model")
    not_a_model = tmp_path / "notes.model"
    not_a_model.write_text("this is not a SentencePiece model\n")
    with pytest.raises(UserError, match="notes.model: not a SentencePiece model"):
        load_tokenizer(not_a_model)


def _chat_file(path, contents):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": user},
                                                     {"role": "model", "content": model}]}) + "\n"
                            for user, model in contents), encoding="utf-8")
    return path


def test_chat_with_more_distinct_characters_than_pieces_is_one_line_naming_tokenizer(tmp_path):
    """900 CJK characters do not fit a 512-piece tokenizer beside its 256 byte pieces."""
    rng = random.Random(0)
    say = lambda: "".join(chr(0x4E00 + rng.randrange(900)) for _ in range(12))  # noqa: E731
    path = _chat_file(tmp_path / "cjk.jsonl", [(say(), say()) for _ in range(300)])
    with pytest.raises(UserError, match=r"cjk.jsonl: cannot train a tokenizer of at most 512 pieces on it \(9\d\d distinct "
                                        r"characters, each of which needs a piece\); pass --tokenizer PATH"):
        train_tokenizer(path, tmp_path / "cjk.model", vocab_size=512)
    assert not (tmp_path / "cjk.model").exists()


def test_a_file_without_one_usable_row_is_one_line_naming_tokenizer(tmp_path):
    path = _chat_file(tmp_path / "empty.jsonl", [("hello", "")])  # no model turn to train on
    with pytest.raises(UserError, match=r"empty.jsonl: cannot train a tokenizer .*\(no usable rows.*; pass --tokenizer PATH"):
        train_tokenizer(path, tmp_path / "empty.model", vocab_size=512)


def test_a_tokenizer_that_cannot_be_read_is_one_line():
    """gs:// reads go through TensorFlow's file system: with no network (CI) its error is no OSError and
    used to end in a traceback; with one, the bucket does not exist. Either way: one line naming the file."""
    with pytest.raises(UserError, match=r"^tokenizer gs://gemma-tpu-no-such-bucket-7f3a/t\.model: (cannot read it|file not found)"):
        load_tokenizer("gs://gemma-tpu-no-such-bucket-7f3a/t.model")
