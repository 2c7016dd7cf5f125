"""A run's inputs: its tokenizer and opened data, generated for the demo presets, and the lines that describe them."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import sys

from trainer.config import TrainConfig
from trainer.data import loader as data_lib
from trainer.data import tokenizer as tokenizer_lib
from trainer.data.chat_corpus import write_chat_corpus
from trainer.data.corpus import write_corpus
from trainer.data.vision_corpus import write_vision_corpus
from trainer.model import models
from trainer.run import mesh


# The demo's generated inputs (`--preset tiny` or `tiny-chat` without --data / --tokenizer).
DEMO_STORIES = 4000
DEMO_CONVERSATIONS = 4000
DEMO_IMAGES = 8000
DEMO_VOCAB_SIZE = 512


@dataclasses.dataclass(frozen=True)
class Inputs:
    data: object  # trainer.data.loader.TokenizedData
    tokenizer: object  # trainer.data.tokenizer.Tokenizer
    data_source: str
    tokenizer_path: str


def resolve_inputs(config: TrainConfig, workdir: pathlib.Path) -> Inputs:
    """The tokenizer and the opened data; `--preset tiny` (stories), `tiny-chat` (conversations) and
    `tiny-vision` (pictures of shapes, asked about) generate what they are not given. A tokenizer trained here for chat data has the turn markers.

    What is generated or prepared in the workdir is made by process 0 while the others wait
    (mesh.process_zero_first): a multi-host slice shares one workdir.
    """
    generated = workdir / "data"
    # No --data only with --preset (parse_config).
    data_source = config.data or str(generated / ("corpus.txt" if config.preset == "tiny" else "chat.jsonl"))
    tokenizer_path = config.tokenizer
    if tokenizer_path is None:
        tokenizer_path = str(generated / "tokenizer.model") if config.model == models.TINY else tokenizer_lib.OFFICIAL_TOKENIZER

    def make_and_open():
        if config.data is None and not pathlib.Path(data_source).exists():
            if config.preset == "tiny-chat":
                write_chat_corpus(data_source, num_conversations=DEMO_CONVERSATIONS, seed=config.seed)
            elif config.preset == "tiny-vision":
                write_vision_corpus(data_source, num_images=DEMO_IMAGES, seed=config.seed)
            else:
                write_corpus(data_source, num_stories=DEMO_STORIES, seed=config.seed)
        if config.tokenizer is None and config.model == models.TINY and not pathlib.Path(tokenizer_path).exists():
            tokenizer_lib.train_tokenizer(data_source, tokenizer_path, vocab_size=DEMO_VOCAB_SIZE, seed=config.seed,
                                          data_format=config.data_format)
        tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)  # the run's one load: everything after gets it
        return tokenizer, data_lib.open_data(data_source, tokenizer=tokenizer, cache_dir=str(workdir / "data_cache"),
                                             data_format=config.data_format, loss_on=config.loss_on,
                                             on_bad_row=config.on_bad_row, warn=_notice,
                                             image_layout=models.image_layout(config.model, vocab_size=tokenizer.vocab_size))

    tokenizer, data = mesh.process_zero_first(f"the inputs in {workdir}", make_and_open)
    return Inputs(data=data, tokenizer=tokenizer, data_source=data_source, tokenizer_path=tokenizer_path)


def _notice(line: str) -> None:
    print(f"trainer: {line}", file=sys.stderr, flush=True)


def describe_data(inputs: Inputs) -> str:
    """The data line a run starts with: what was read as what, and what was left out."""
    data = inputs.data
    skipped = data.skipped_rows
    line = (f"{inputs.data_source}: {data.data_format}, {data.documents} documents, {data.tokens} tokens, "
            f"loss on {data.loss_on}")
    if data.images:
        line += f", {data.images['images']} images (at most {data.images_per_row} a row)"
    if skipped:
        line += f"; skipped {sum(skipped.values())} bad rows (" + ", ".join(f"{r} {n}" for r, n in skipped.items()) + ")"
    return line


def batch_digest(local_batch: dict) -> str:
    """A short digest of a batch's rows (this process's share): equal digests in two runs' metrics
    mean the step trained on the same data, e.g. after a resume."""
    digest = hashlib.sha256()
    for key in sorted(local_batch):
        digest.update(key.encode() + local_batch[key].tobytes())
    return digest.hexdigest()[:12]
