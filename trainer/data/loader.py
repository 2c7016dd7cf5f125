"""The loader: prepared documents -> packed, masked batches, one process's share, in a fixed order.

The global batch is `global_batch_size` (B) packing streams. Each epoch the training documents are
shuffled from the seed, and each run of B consecutive documents gives one to every stream, the
longest to the stream with the fewest tokens so far (plain k mod B leaves the longest of 128 streams
~3% longer than the mean, which a finite pass pays in padding rows). A stream cuts its documents
into windows of at most `seq_len` next-token pairs (BOS prepended, so the first token is predicted
too; each window is a segment of its own, positions from 0) and packs them into rows. Process p of
P produces the rows of streams [p*B/P, (p+1)*B/P) and reads only their documents, so the data order
does not depend on P.

Packing is planned from `lengths.npy` alone, so every process can compute, without reading any
other process's documents, how many batches an epoch has: as many as the longest stream has rows
when the split is in its reference order (training: the shuffle of seed 0). That count does not
depend on the seed, so a schedule built from `steps_per_epoch` and every process agree on it; a
finite pass of another seed is padded with empty rows or cut to it, at its very end (at B=128 on
330k stories: 0.9% padding rows, no row cut). Hence a packer of our own rather than grain's
First/BestFitPackIterDataset. It is best-fit (a window goes where it leaves the least room) and
emits one row at a time (the fullest, when a window fits nowhere) instead of all bins at once: on
TinyStories-like lengths at seq 256, 97-98% of positions hold a token.

Streams flow from one epoch into the next (an open row may mix the end of one epoch with the start
of the next), so `epochs=None` never pads.
"""

import atexit
import dataclasses
import hashlib
import json
import pathlib
import weakref

import grain
import numpy as np

from trainer.data import chat, formats
from trainer.data import prepare as prepare_lib
from trainer.errors import UserError
from trainer.data.tokenizer import Tokenizer

# Rows open at once in each stream: more bins fill rows a little better (96.0% with 64) at the cost
# of a longer scan per window.
PACKING_BINS = 16
PREFETCH_BATCHES = 4
# The held-out split must not change with the training seed, so runs with different seeds share it.
_SPLIT_SEED = 0
# The training order whose packing defines the number of batches in an epoch, for every seed.
_REFERENCE_SEED = 0
_epoch_rows_cache: dict[tuple, int] = {}


@dataclasses.dataclass(frozen=True)
class TokenizedData:
    """A prepared dataset: its directory, its meta.json and the token count of every document."""

    path: str
    meta: dict
    lengths: np.ndarray  # [documents] int32, EOS included

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

    def source(self) -> grain.sources.ArrayRecordDataSource:
        """Random access to the documents' token records, in document order across the shards."""
        return grain.sources.ArrayRecordDataSource([str(pathlib.Path(self.path) / s["file"]) for s in self.meta["shards"]])


def _cache_name(text_path: pathlib.Path, tokenizer_sha256: str, options: dict) -> str:
    stat = text_path.stat()
    identity = json.dumps([str(text_path.resolve()), stat.st_size, stat.st_mtime_ns, tokenizer_sha256, options])
    return f"{text_path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def open_data(data: str, *, tokenizer: Tokenizer, cache_dir: str, data_format: str = formats.AUTO,
              loss_on: str = chat.COMPLETIONS, on_bad_row: str = formats.FAIL, log=lambda message: None) -> TokenizedData:
    """Opens `data`: a directory made by `trainer.data.prepare` (checked against `tokenizer`) or a raw
    file (text, JSONL or Parquet: trainer.data.formats), which is prepared once into `cache_dir` with
    `data_format`, `loss_on` and `on_bad_row` and reused while it, the tokenizer and those are unchanged."""
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
        meta = prepare_lib.prepare(data_path, tokenizer, directory, **options, on_bad_row=on_bad_row, log=log)
    else:
        raise UserError(f"--data {data}: not found; pass a text, JSONL or Parquet file or a directory made by "
                        "`python -m trainer.data.prepare`")
    lengths = np.load(directory / meta["lengths_file"])
    return TokenizedData(path=str(directory), meta=meta, lengths=lengths)


def _split(data: TokenizedData, split: str, eval_fraction: float) -> np.ndarray:
    """Document ids of `split`, ascending. The eval split is a seed-independent random fraction."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval fraction {eval_fraction}: must be at least 0 and below 1")
    eval_documents = int(data.documents * eval_fraction)
    if eval_fraction > 0 and eval_documents == 0:
        raise UserError(f"eval fraction {eval_fraction} of {data.documents} documents selects none; raise it")
    order = np.random.default_rng(_SPLIT_SEED).permutation(data.documents)
    return np.sort(order[:eval_documents] if split == "eval" else order[eval_documents:])


def _balanced_streams(lengths: np.ndarray, streams: int) -> np.ndarray:
    """The stream of each document (given in order): each run of `streams` documents gives one to
    every stream, the longest to the stream with the fewest tokens so far."""
    stream_of = np.empty(len(lengths), np.int64)
    totals = np.zeros(streams, np.int64)
    for start in range(0, len(lengths), streams):
        run = lengths[start:start + streams]
        longest_first = np.argsort(-run, kind="stable")
        emptiest_first = np.argsort(totals, kind="stable")[:len(run)]
        stream_of[start + longest_first] = emptiest_first
        totals[emptiest_first] += run[longest_first]
    return stream_of


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every process agrees on: which windows each stream packs, epoch by epoch."""

    lengths: np.ndarray
    documents: np.ndarray  # the split's document ids
    seq_len: int
    streams: int
    seed: int
    shuffle: bool
    epochs: int | None
    bins: int
    cache_key: tuple  # identifies the reference packing (the data and every field above but seed and epochs)
    _epochs: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def _streams_of(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """`epoch`'s documents grouped by stream (each group in shuffled order) and the groups' bounds.
        Only the latest epoch is kept: every stream of a process needs it at about the same time."""
        if epoch not in self._epochs:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.documents) if self.shuffle \
                else self.documents
            stream_of = _balanced_streams(self.lengths[order], self.streams)
            by_stream = np.argsort(stream_of, kind="stable")
            bounds = np.searchsorted(stream_of[by_stream], np.arange(self.streams + 1))
            self._epochs.clear()
            self._epochs[epoch] = (order[by_stream], bounds)
        return self._epochs[epoch]

    def windows(self, stream: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document, window index, pairs) of each window of `stream` in `epoch`, in packing order."""
        grouped, bounds = self._streams_of(epoch)
        documents = grouped[bounds[stream]:bounds[stream + 1]]
        # A document of n stored tokens (ids + EOS) gives n next-token pairs after the BOS is prepended.
        pairs = self.lengths[documents].astype(np.int64)
        counts = -(-pairs // self.seq_len)
        window_document = np.repeat(documents, counts)
        window_index = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        window_pairs = np.minimum(self.seq_len, np.repeat(pairs, counts) - window_index * self.seq_len)
        return window_document, window_index, window_pairs

    def window_pairs(self, document: int, window: int) -> int:
        return int(min(self.seq_len, self.lengths[document] - window * self.seq_len))

    def epoch_rows(self) -> int:
        """Batches in an epoch: rows of the longest stream packing the reference order's epoch 0."""
        if self.cache_key not in _epoch_rows_cache:
            reference = dataclasses.replace(self, seed=_REFERENCE_SEED, epochs=1, _epochs={})
            rows = 0
            for stream in range(self.streams):
                packer, count = _StreamPacker(reference, stream), 0
                while packer.next_row() is not None:
                    count += 1
                rows = max(rows, count)
            _epoch_rows_cache[self.cache_key] = rows
        return _epoch_rows_cache[self.cache_key]


class _StreamPacker:
    """Best-fit packing of one stream's windows with at most `bins` rows open. A window goes into
    the open row it leaves least room in; when none has room, the fullest row is emitted and a new
    one is opened. A full-length window is a row by itself. Rows are lists of (document, window)."""

    def __init__(self, plan: _Plan, stream: int):
        self.plan, self.stream = plan, stream
        self.epoch, self.cursor = 0, 0
        self.open_rows: list[list[tuple[int, int]]] = []
        self._free: list[int] = []
        self._load_epoch()

    def _load_epoch(self) -> None:
        self._windows = self.plan.windows(self.stream, self.epoch) if not self.finished_epochs() else None

    def finished_epochs(self) -> bool:
        return self.plan.epochs is not None and self.epoch >= self.plan.epochs

    def _emit(self, index: int) -> list[tuple[int, int]]:
        self._free.pop(index)
        return self.open_rows.pop(index)

    def next_row(self) -> list[tuple[int, int]] | None:
        """The next packed row, or None when the stream's last epoch is packed and emitted."""
        seq_len = self.plan.seq_len
        while not self.finished_epochs():
            documents, windows, pairs = self._windows
            if self.cursor == len(pairs):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._load_epoch()
                continue
            window, size = (int(documents[self.cursor]), int(windows[self.cursor])), int(pairs[self.cursor])
            self.cursor += 1
            if size == seq_len:
                return [window]
            fits = min((i for i, free in enumerate(self._free) if free >= size), key=self._free.__getitem__,
                       default=None)
            if fits is not None:
                self.open_rows[fits].append(window)
                self._free[fits] -= size
                if self._free[fits] == 0:
                    return self._emit(fits)
                continue
            emitted = self._emit(int(np.argmin(self._free))) if len(self.open_rows) == self.plan.bins else None
            self.open_rows.append([window])
            self._free.append(seq_len - size)
            if emitted is not None:
                return emitted
        return self._emit(0) if self.open_rows else None

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "open_rows": [[list(w) for w in row] for row in self.open_rows]}

    def set_state(self, state: dict) -> None:
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self.open_rows = [[tuple(w) for w in row] for row in state["open_rows"]]
        self._free = [self.plan.seq_len - sum(self.plan.window_pairs(*w) for w in row) for row in self.open_rows]
        self._load_epoch()


class _BatchIterator(grain.DatasetIterator):
    """This process's rows of the global batch, as numpy arrays; state is JSON for grain's checkpoint."""

    def __init__(self, data: TokenizedData, plan: _Plan, bos_id: int, streams: range):
        super().__init__()
        self._plan, self._bos_id, self._data = plan, bos_id, data
        self._source = data.source()
        self._packers = [_StreamPacker(plan, stream) for stream in streams]
        self._step = 0

    def _row(self, windows: list[tuple[int, int]], tokens_of: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """One packed row; a target position is trained when its target token is (the document's mask)."""
        seq_len = self._plan.seq_len
        row = {key: np.zeros(seq_len, np.int32) for key in ("input_tokens", "target_tokens", "segment_ids", "positions")}
        row["loss_mask"] = np.zeros(seq_len, np.float32)
        offset = 0
        for segment, (document, window) in enumerate(windows, start=1):
            tokens, trained = tokens_of[document]
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
            tokens_of[document] = (np.concatenate([[self._bos_id], tokens]), np.concatenate([[0.0], trained]))
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


def _plan(data, *, seq_len, global_batch_size, seed, split, eval_fraction, epochs, bins) -> _Plan:
    if seq_len < 1 or global_batch_size < 1:
        raise UserError(f"sequence length {seq_len} and batch size {global_batch_size}: both must be at least 1")
    documents = _split(data, split, eval_fraction)
    if split == "train" and len(documents) < global_batch_size:
        raise UserError(f"--batch-size {global_batch_size}: {len(documents)} training documents cannot fill "
                        f"{global_batch_size} batch rows; lower the batch size or add documents")
    return _Plan(lengths=data.lengths, documents=documents, seq_len=seq_len, streams=global_batch_size, seed=seed,
                 shuffle=split == "train", epochs=1 if split == "eval" else epochs, bins=bins,
                 cache_key=(data.path, data.documents, data.tokens, split, eval_fraction, seq_len, global_batch_size, bins))


def batches(data: TokenizedData, *, seq_len: int, global_batch_size: int, seed: int, split: str = "train",
            eval_fraction: float = 0.0, epochs: int | None = None, process_index: int = 0, process_count: int = 1,
            prefetch: bool = True, packing_bins: int = PACKING_BINS) -> grain.DatasetIterator:
    """This process's share of the global batches: dicts of [global_batch_size // process_count, seq_len]
    arrays `input_tokens`, `target_tokens`, `segment_ids`, `positions` (int32) and `loss_mask` (float32).
    `epochs=None` repeats forever, reshuffled each epoch; `epochs=E` yields E * steps_per_epoch(...)
    batches; split "eval" is one pass in a fixed order.
    The iterator has get_state()/set_state() and works with grain.checkpoint.CheckpointSave/Restore."""
    if global_batch_size % process_count:
        raise UserError(f"batch size {global_batch_size} is not divisible by the {process_count} processes; "
                        "pick a multiple")
    plan = _plan(data, seq_len=seq_len, global_batch_size=global_batch_size, seed=seed, split=split,
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
                    packing_bins: int = PACKING_BINS) -> int:
    """Global batches in one training epoch, for every seed and process count: `batches(..., epochs=E)`
    yields exactly E times this many. Reads only the document lengths."""
    return _plan(data, seq_len=seq_len, global_batch_size=global_batch_size, seed=_REFERENCE_SEED, split="train",
                 eval_fraction=eval_fraction, epochs=1, bins=packing_bins).epoch_rows()
