"""The benchmark inputs: a generated TinyStories-like corpus, its tokenizer and its prepared form.

Both sides of a comparison read these same files, built once per workdir with the trainer's own data
functions (the `--preset tiny` demo's story count and vocabulary), and reused by later runs.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from trainer import loop
from trainer.data import loader as data_lib
from trainer.data.chat_corpus import write_chat_corpus
from trainer.data.corpus import SEPARATOR, write_corpus
from trainer.data.formats import read_documents
from trainer.data.tokenizer import Tokenizer, load_tokenizer, train_tokenizer

DEFAULT_WORKDIR = "/tmp/gemma-tpu-bench"


@dataclasses.dataclass(frozen=True)
class BenchInputs:
    corpus_path: pathlib.Path
    tokenizer: Tokenizer
    data: data_lib.TokenizedData  # the corpus prepared by trainer.data.prepare (via open_data)

    def documents(self) -> list[str]:
        """The corpus's documents as text, in file order (what the tutorial's loop reads)."""
        return list(read_documents(self.corpus_path, SEPARATOR))


def build_inputs(workdir, *, stories: int = loop.DEMO_STORIES, seed: int = 0) -> BenchInputs:
    workdir = pathlib.Path(workdir) / f"inputs-{stories}-{seed}"
    corpus_path = workdir / "corpus.txt"
    tokenizer_path = workdir / "tokenizer.model"
    if not corpus_path.exists():
        write_corpus(corpus_path, num_stories=stories, seed=seed)
    if not tokenizer_path.exists():
        train_tokenizer(corpus_path, tokenizer_path, vocab_size=loop.DEMO_VOCAB_SIZE, seed=seed)
    tokenizer = load_tokenizer(tokenizer_path)
    data = data_lib.open_data(str(corpus_path), tokenizer=tokenizer, cache_dir=str(workdir / "prepared"))
    return BenchInputs(corpus_path=corpus_path, tokenizer=tokenizer, data=data)


CHAT_CONVERSATIONS = 20_000  # about 0.7M tokens: dozens of gemma3-1b steps of 8 x 1024 before a row repeats


def build_chat_inputs(workdir, *, conversations: int = CHAT_CONVERSATIONS, seed: int = 0) -> tuple[pathlib.Path, pathlib.Path]:
    """(chat JSONL, its tokenizer): what bench.trainer_side gives `python -m trainer`, built once per workdir
    with the trainer's own generator (the `--preset tiny-chat` demo's) and tokenizer training."""
    workdir = pathlib.Path(workdir) / f"chat-{conversations}-{seed}"
    chat_path, tokenizer_path = workdir / "chat.jsonl", workdir / "tokenizer.model"
    if not chat_path.exists():
        write_chat_corpus(chat_path, num_conversations=conversations, seed=seed)
    if not tokenizer_path.exists():
        train_tokenizer(chat_path, tokenizer_path, vocab_size=loop.DEMO_VOCAB_SIZE, seed=seed)
    return chat_path, tokenizer_path


def length_distribution(inputs: BenchInputs, seq_len: int) -> str:
    """One line on document lengths in tokens (EOS included) and words, for the printed report."""
    tokens = inputs.data.lengths
    words = np.array([len(document.split()) for document in inputs.documents()])
    p50, p90, p99 = np.percentile(tokens, [50, 90, 99])
    return (
        f"corpus: {inputs.data.documents} documents, {inputs.data.tokens} tokens; tokens/document mean {tokens.mean():.0f}, "
        f"median {p50:.0f}, p90 {p90:.0f}, p99 {p99:.0f}, max {tokens.max()}; "
        f"{np.mean(tokens > 256):.0%} past 256, {np.mean(tokens > seq_len):.0%} past seq_len {seq_len}; "
        f"words/document mean {words.mean():.0f}"
    )
