"""SentencePiece tokenizers: train a small one for the demo, load any one from exactly the given path.

The ids follow Gemma's: PAD 0, EOS 1, BOS 2, UNK 3. `gm.text.Gemma3Tokenizer` would prefer a cached
copy under ~/.gemma over the path it is given; this wrapper reads the file it is told to read.
"""

import dataclasses
import hashlib
import io
import pathlib

import sentencepiece as spm
from etils import epath

from trainer.data import chat, formats
from trainer.data.corpus import SEPARATOR
from trainer.errors import UserError, first_line
from trainer.shared_files import replaced_atomically
from trainer.storage import check_reachable, reading

# The Gemma 3 tokenizer of the official weights (the gemma package's `gm.text.Gemma3Tokenizer.path`).
OFFICIAL_TOKENIZER = "gs://gemma-data/tokenizers/tokenizer_gemma3.model"
_LOCAL_TOKENIZER = "pass a local SentencePiece .model file"  # for a gs:// one that cannot be read


PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
_SPECIAL_PIECES = 4  # the four ids above
_BYTE_PIECES = 256  # byte fallback: a piece for every byte value
# Bounds the memory of tokenizer training on a large corpus; a few hundred thousand lines are plenty.
_MAX_TRAINING_LINES = 300_000


def _text_lines(corpus_path: pathlib.Path, separator: str):
    with corpus_path.open(encoding="utf-8") as corpus:
        for line in corpus:
            line = line.replace(separator, "").strip()
            if line:
                yield line


def _row_lines(corpus_path: pathlib.Path, data_format: str):
    """The lines of each usable row: a text row's, or a conversation's as rendered (turn markers included)."""
    for _, row in formats.read_rows(corpus_path, data_format, name=str(corpus_path), separator=SEPARATOR):
        if isinstance(row, formats.InvalidRow):
            continue
        try:
            text = row.text if row.messages is None else chat.text_of(chat.render(row.messages, loss_on=chat.ALL))
        except formats.InvalidRow:
            continue
        yield from (line.strip() for line in text.splitlines() if line.strip())


class _SeenLines:
    """The training lines as SentencePiece reads them, counted, with the characters they use: what
    explains a corpus SentencePiece cannot train on."""

    def __init__(self, lines):
        self._lines, self.count, self.characters = lines, 0, set()

    def __iter__(self):
        for line in self._lines:
            self.count += 1
            self.characters.update(line)
            yield line

    def why_untrainable(self, error: RuntimeError, vocab_size: int) -> str:
        if not self.count:
            return "no usable rows: every row is empty or invalid"
        # Every character is a piece of its own, beside the byte pieces and the special ones.
        if len(self.characters) + _BYTE_PIECES + _SPECIAL_PIECES > vocab_size:
            return f"{len(self.characters)} distinct characters, each of which needs a piece"
        return "SentencePiece: " + first_line(error).rpartition("] ")[2]


def train_tokenizer(corpus_path, output_path, *, vocab_size: int = 512, seed: int = 0,
                    data_format: str = formats.AUTO) -> pathlib.Path:
    """Trains a BPE SentencePiece model with byte fallback on the lines of `corpus_path` (the
    document separator left out) and writes it to `output_path`. The same corpus and seed give
    the same file. For chat data (`data_format` auto on a chat file, or a chat format) the turn
    markers are single pieces and text is kept as written (no space added before it, whitespace
    not normalised), so that chat pieces tokenized apart join into the rendered conversation.

    `vocab_size` is an upper bound: a small corpus with a small vocabulary has fewer distinct
    merges than that, and the model then has as many pieces as the corpus supports. A corpus it
    cannot train on (no usable rows, more distinct characters than the pieces hold) is a UserError
    that names --tokenizer."""
    corpus_path, output_path = pathlib.Path(corpus_path), pathlib.Path(output_path)
    if not corpus_path.is_file():
        raise UserError(f"{corpus_path}: corpus file not found; pass an existing text file to train a tokenizer")
    data_format = formats.detect(corpus_path, data_format, name=str(corpus_path))
    if data_format == formats.TEXT:
        lines, options = _text_lines(corpus_path, SEPARATOR), {}
    else:
        lines = _row_lines(corpus_path, data_format)
        options = {}
        if formats.kind_of(data_format) != formats.TEXT:
            options = dict(user_defined_symbols=[*chat.TURN_TOKENS, *chat.IMAGE_MARKERS], normalization_rule_name="identity",
                           add_dummy_prefix=False, remove_extra_whitespaces=False)
    spm.set_random_generator_seed(seed)
    model, seen = io.BytesIO(), _SeenLines(lines)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(seen),
            model_writer=model,
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # fewer pieces where the corpus has fewer merges to learn
            model_type="bpe",
            byte_fallback=True,
            character_coverage=1.0,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            bos_id=BOS_ID,
            unk_id=UNK_ID,
            input_sentence_size=_MAX_TRAINING_LINES,
            shuffle_input_sentence=True,
            minloglevel=2,
            **options,
        )
    except RuntimeError as error:
        raise UserError(f"{corpus_path}: cannot train a tokenizer of at most {vocab_size} pieces on it "
                        f"({seen.why_untrainable(error, vocab_size)}); pass --tokenizer PATH, a SentencePiece model with "
                        "PAD id 0 and EOS and BOS ids that covers this data") from None
    with replaced_atomically(output_path) as temporary:
        temporary.write_bytes(model.getvalue())
    return output_path


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A loaded SentencePiece model. `sha256` identifies the file, so prepared data can be checked
    against the tokenizer a run is given; `model_bytes` is the file, for an export to copy."""

    path: str
    vocab_size: int
    pad_id: int
    eos_id: int
    bos_id: int
    sha256: str
    processor: spm.SentencePieceProcessor = dataclasses.field(repr=False, compare=False)
    model_bytes: bytes = dataclasses.field(repr=False, compare=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS or EOS."""
        return self.processor.encode(text)

    def encode_batch(self, texts: list[str], *, threads: int = 1) -> list[list[int]]:
        """Token ids of each text (no BOS/EOS), on `threads` native threads."""
        return self.processor.encode(texts, num_threads=threads)

    def decode(self, ids) -> str:
        return self.processor.decode([int(i) for i in ids])


def load_tokenizer(path) -> Tokenizer:
    """Loads the SentencePiece model at `path` (a local path or gs://). Raises UserError naming the
    file when it is missing, is not a SentencePiece model, or has no PAD 0 / EOS / BOS ids."""
    file = epath.Path(path)
    check_reachable("tokenizer", path, instead=_LOCAL_TOKENIZER)
    with reading("tokenizer", path, instead=_LOCAL_TOKENIZER):
        found = file.is_file()
        model_bytes = file.read_bytes() if found else b""
    if not found:
        raise UserError(f"tokenizer {path}: file not found; pass the path of a SentencePiece .model file")
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model_bytes)
    except (RuntimeError, OSError, ValueError) as error:
        raise UserError(f"tokenizer {path}: not a SentencePiece model ({error}); pass a .model file") from None
    if processor.pad_id() != PAD_ID or processor.eos_id() < 0 or processor.bos_id() < 0:
        raise UserError(
            f"tokenizer {path}: needs PAD id {PAD_ID} and EOS and BOS ids (has PAD {processor.pad_id()}, "
            f"EOS {processor.eos_id()}, BOS {processor.bos_id()}); the trainer uses id 0 as padding"
        )
    return Tokenizer(
        path=str(path),
        vocab_size=processor.vocab_size(),
        pad_id=processor.pad_id(),
        eos_id=processor.eos_id(),
        bos_id=processor.bos_id(),
        sha256=hashlib.sha256(model_bytes).hexdigest(),
        processor=processor,
        model_bytes=model_bytes,
    )
