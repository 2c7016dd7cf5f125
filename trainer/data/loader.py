"""The loader: prepared documents -> packed, masked batches, one process's share, in a fixed order.

Which windows of which documents each row holds is planned by trainer.data.packing from the
documents' lengths alone, so the data order does not depend on the number of processes. Process p of
P produces the rows of streams [p*B/P, (p+1)*B/P) of the global batch of B rows and reads only their
documents' records; a thread prefetches the next batches. Data with images adds `images` to a batch:
[rows, images_per_row, size, size, 3] uint8, a row's images in the order of their soft tokens, zeros past them. The iterator's position (each stream's
open rows) is JSON for grain's checkpoint.
"""

import atexit
import dataclasses
import hashlib
import json
import pathlib
import weakref

import grain
import numpy as np

from trainer.data import chat, formats, images, packing
from trainer.data import prepare as prepare_lib
from trainer.data.tokenizer import Tokenizer
from trainer.errors import UserError

PREFETCH_BATCHES = 4


@dataclasses.dataclass(frozen=True)
class TokenizedData:
    """A prepared dataset: its directory, its meta.json and the token count of every document."""

    path: str
    meta: dict
    lengths: np.ndarray  # [documents] int32, EOS included
    image_counts: np.ndarray | None = None  # [documents] int32, with images only

    @property
    def images(self) -> dict | None:
        """How its records hold images (trainer.data.prepare's meta "images"), None without."""
        return self.meta.get("images")

    @property
    def images_per_row(self) -> int:
        """The images a packed row holds at most (a batch's `images` axis): as many as the fullest document has."""
        return self.images["max_per_document"] if self.images else 0

    @property
    def documents(self) -> int:
        return self.meta["documents"]

    @property
    def tokens(self) -> int:
        return self.meta["tokens"]

    @property
    def vocab_size(self) -> int:
        return self.meta["tokenizer"]["vocab_size"]

    @property
    def data_format(self) -> str:
        return self.meta.get("data_format", formats.TEXT)  # format 1 prepared text only

    @property
    def loss_on(self) -> str:
        """What the prepared records train on (format 1 prepared text: every token)."""
        return self.meta.get("loss_on", chat.ALL)

    @property
    def skipped_rows(self) -> dict[str, int]:
        """Bad rows left out while preparing, by reason (none recorded before format 2)."""
        return self.meta.get("skipped_rows", {})

    @property
    def is_chat(self) -> bool:
        return formats.kind_of(self.data_format) != formats.TEXT

    def tokens_and_mask(self, document: int, record: bytes) -> tuple[np.ndarray, np.ndarray]:
        """A record's token ids and whether each is trained (all of them unless the record carries a mask)."""
        length = int(self.lengths[document])
        tokens = np.frombuffer(record, prepare_lib.TOKEN_DTYPE, count=length)
        if self.meta.get("loss_mask") != prepare_lib.LOSS_MASK_BITS:
            return tokens, np.ones(length, np.float32)
        bits = np.frombuffer(record, np.uint8, offset=length * prepare_lib.TOKEN_DTYPE.itemsize)
        return tokens, np.unpackbits(bits, count=length, bitorder=prepare_lib.MASK_BIT_ORDER).astype(np.float32)

    def record_images(self, document: int, record: bytes) -> np.ndarray:
        """[images, size, size, 3] uint8: the pixels after a record's tokens (and mask)."""
        length, size = int(self.lengths[document]), self.images["size"]
        offset = length * prepare_lib.TOKEN_DTYPE.itemsize
        if self.meta.get("loss_mask") == prepare_lib.LOSS_MASK_BITS:
            offset += -(-length // 8)
        return np.frombuffer(record, np.uint8, offset=offset).reshape(-1, size, size, 3)

    def source(self) -> grain.sources.ArrayRecordDataSource:
        """Random access to the documents' token records, in document order across the shards."""
        return grain.sources.ArrayRecordDataSource([str(pathlib.Path(self.path) / s["file"]) for s in self.meta["shards"]])


def _cache_name(text_path: pathlib.Path, tokenizer_sha256: str, options: dict) -> str:
    stat = text_path.stat()
    identity = json.dumps([str(text_path.resolve()), stat.st_size, stat.st_mtime_ns, tokenizer_sha256, options])
    return f"{text_path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def open_data(data: str, *, tokenizer: Tokenizer, cache_dir: str, data_format: str = formats.AUTO,
              loss_on: str = chat.COMPLETIONS, on_bad_row: str = formats.FAIL, image_layout: images.Layout | None = None,
              warn=None) -> TokenizedData:
    """Opens `data`: a directory made by `trainer.data.prepare` (checked against `tokenizer` and, if it has
    images, `image_layout`) or a raw file (text, JSONL or Parquet: trainer.data.formats), which is prepared
    once into `cache_dir` with `data_format`, `loss_on`, `on_bad_row` and `image_layout` (how the model reads
    images; None: it reads none) and reused while it, the tokenizer and those are unchanged. `warn` gets a
    line for each bad image skipped."""
    data_path = pathlib.Path(data)
    if data_path.is_dir():
        directory = data_path
        meta = prepare_lib.read_meta(directory)
        if meta["tokenizer"]["sha256"] != tokenizer.sha256:
            raise UserError(
                f"--data {data}: prepared with tokenizer {meta['tokenizer']['path']} "
                f"(vocabulary {meta['tokenizer']['vocab_size']}), not with --tokenizer {tokenizer.path} "
                f"(vocabulary {tokenizer.vocab_size}); pass that tokenizer or prepare the data again"
            )
        prepared_as = meta.get("data_format", formats.TEXT)
        if data_format not in (formats.AUTO, prepared_as):
            raise UserError(f"--data-format {data_format}: --data {data} was prepared from {prepared_as}; leave "
                            "--data-format out for a prepared directory, or prepare the raw file again")
    elif data_path.is_file():
        options = {"data_format": data_format, "loss_on": loss_on}
        directory = pathlib.Path(cache_dir) / _cache_name(data_path, tokenizer.sha256, options)
        meta = prepare_lib.prepare(data_path, tokenizer, directory, **options, on_bad_row=on_bad_row,
                                   image_layout=image_layout, warn=warn)
    else:
        raise UserError(f"--data {data}: not found; pass a text, JSONL or Parquet file or a directory made by "
                        "`python -m trainer.data.prepare`")
    # The layout is no part of a cached preparation's name: data without images prepares the same for every model.
    prepared_images = meta.get("images")
    if prepared_images and (image_layout is None or image_layout.identity() != [
            prepared_images["size"], prepared_images["token_id"], prepared_images["soft_tokens"]]):
        raise UserError(f"--data {data}: prepared with images of {prepared_images['size']} pixels as "
                        f"{prepared_images['soft_tokens']} tokens {prepared_images['token_id']}, which the model "
                        f"reads {'not' if image_layout is None else 'otherwise'}; prepare the data for its --model")
    lengths = np.load(directory / meta["lengths_file"])
    counts = np.load(directory / meta["images"]["counts_file"]) if meta.get("images") else None
    return TokenizedData(path=str(directory), meta=meta, lengths=lengths, image_counts=counts)


class _BatchIterator(grain.DatasetIterator):
    """This process's rows of the global batch, as numpy arrays; state is JSON for grain's checkpoint."""

    def __init__(self, data: TokenizedData, plan: packing.Plan, bos_id: int, streams: range):
        super().__init__()
        self._plan, self._bos_id, self._data = plan, bos_id, data
        self._source = data.source()
        self._packers = [packing.StreamPacker(plan, stream) for stream in streams]
        self._step = 0

    def _row(self, windows: list[tuple[int, int]], tokens_of: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]
             ) -> dict[str, np.ndarray]:
        """One packed row; a target position is trained when its target token is (the document's mask). A
        document with images is one window (trainer.data.packing), so its images are the row's in order."""
        seq_len = self._plan.seq_len
        row = {key: np.zeros(seq_len, np.int32) for key in ("input_tokens", "target_tokens", "segment_ids", "positions")}
        row["loss_mask"] = np.zeros(seq_len, np.float32)
        if self._data.images:
            size = self._data.images["size"]
            row["images"] = np.zeros((self._data.images_per_row, size, size, 3), np.uint8)
        offset, image = 0, 0
        for segment, (document, window) in enumerate(windows, start=1):
            tokens, trained, pixels = tokens_of[document]
            if pixels is not None and len(pixels):
                row["images"][image:image + len(pixels)] = pixels
                image += len(pixels)
            start, size = window * seq_len, self._plan.window_pairs(document, window)
            span = slice(offset, offset + size)
            row["input_tokens"][span] = tokens[start:start + size]
            row["target_tokens"][span] = tokens[start + 1:start + size + 1]
            row["segment_ids"][span] = segment
            row["positions"][span] = np.arange(size)
            row["loss_mask"][span] = trained[start + 1:start + size + 1]
            offset += size
        return row

    def __next__(self) -> dict[str, np.ndarray]:
        # Planned on the first batch of a finite pass (in the prefetch thread, behind model setup).
        if self._plan.epochs is not None and self._step >= self._plan.epochs * self._plan.epoch_rows():
            raise StopIteration
        rows = [packer.next_row() for packer in self._packers]
        self._step += 1
        # One read for the whole batch: the reader's per-call cost is ~1 ms, its per-record cost ~0.1 ms.
        documents = sorted({document for row in rows for document, _ in row or []})
        tokens_of = {}
        for document, record in zip(documents, self._source.__getitems__(documents) if documents else []):
            tokens, trained = self._data.tokens_and_mask(document, record)
            pixels = self._data.record_images(document, record) if self._data.images else None
            tokens_of[document] = (np.concatenate([[self._bos_id], tokens]), np.concatenate([[0.0], trained]), pixels)
        built = [self._row(row or [], tokens_of) for row in rows]
        return {key: np.stack([row[key] for row in built]) for key in built[0]}

    def get_state(self) -> dict:
        # The streams' open rows as one JSON string: the prefetcher deep-copies the state after every
        # batch, which costs nothing for a string and ~30 ms for 128 streams' nested lists.
        return {"step": self._step, "streams": json.dumps([packer.get_state() for packer in self._packers])}

    def set_state(self, state: dict) -> None:
        streams = json.loads(state["streams"])
        if len(streams) != len(self._packers):
            raise UserError(f"data iterator state holds {len(streams)} streams, this process reads "
                            f"{len(self._packers)}; resume with the batch size and process count of the checkpoint")
        self._step = state["step"]
        for packer, packer_state in zip(self._packers, streams):
            packer.set_state(packer_state)


_PREFETCHING = weakref.WeakSet()
atexit.register(lambda: [iterator.close() for iterator in list(_PREFETCHING)])


class _StoppedAtExit(grain.DatasetIterator):
    """The prefetching iterator, stopped before interpreter shutdown: a prefetch thread still reading
    records at shutdown aborts the process (exit 134 instead of the trainer's own exit code)."""

    def __init__(self, parent: grain.DatasetIterator):
        super().__init__(parent)
        _PREFETCHING.add(self)

    def __next__(self):
        return next(self._parent)

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)

    def close(self) -> None:
        # Drops the parent once closed, so that nothing is left to close during shutdown.
        if self._parents:
            parent, self._parents = self._parent, ()
            parent.close()


class _BatchDataset(grain.IterDataset):
    def __init__(self, make_iterator):
        super().__init__()
        self._make_iterator = make_iterator

    def __iter__(self) -> grain.DatasetIterator:
        return self._make_iterator()


def batches(data: TokenizedData, *, seq_len: int, global_batch_size: int, seed: int, split: str = "train",
            eval_fraction: float = 0.0, epochs: int | None = None, process_index: int = 0, process_count: int = 1,
            prefetch: bool = True, packing_bins: int = packing.PACKING_BINS) -> grain.DatasetIterator:
    """This process's share of the global batches: dicts of [global_batch_size // process_count, seq_len]
    arrays `input_tokens`, `target_tokens`, `segment_ids`, `positions` (int32) and `loss_mask` (float32), and
    with images `images` ([rows, data.images_per_row, size, size, 3] uint8).
    `epochs=None` repeats forever, reshuffled each epoch; `epochs=E` yields E * steps_per_epoch(...)
    batches; split "eval" is one pass in a fixed order.
    The iterator has get_state()/set_state() and works with grain.checkpoint.CheckpointSave/Restore."""
    if global_batch_size % process_count:
        raise UserError(f"batch size {global_batch_size} is not divisible by the {process_count} processes; "
                        "pick a multiple")
    plan = packing.plan_split(data, seq_len=seq_len, global_batch_size=global_batch_size, seed=seed, split=split,
                              eval_fraction=eval_fraction, epochs=epochs, bins=packing_bins)
    rows = global_batch_size // process_count
    streams = range(process_index * rows, (process_index + 1) * rows)
    bos_id = data.meta["tokenizer"]["bos_id"]
    dataset = _BatchDataset(lambda: _BatchIterator(data, plan, bos_id, streams))
    if not prefetch:
        return iter(dataset)
    return _StoppedAtExit(iter(grain.experimental.ThreadPrefetchIterDataset(dataset,
                                                                            prefetch_buffer_size=PREFETCH_BATCHES)))


def steps_per_epoch(data: TokenizedData, *, seq_len: int, global_batch_size: int, eval_fraction: float = 0.0,
                    packing_bins: int = packing.PACKING_BINS) -> int:
    """Global batches in one training epoch, for every seed and process count: `batches(..., epochs=E)`
    yields exactly E times this many. Reads only the document lengths."""
    return packing.plan_split(data, seq_len=seq_len, global_batch_size=global_batch_size, seed=packing.REFERENCE_SEED,
                              split="train", eval_fraction=eval_fraction, epochs=1, bins=packing_bins).epoch_rows()
