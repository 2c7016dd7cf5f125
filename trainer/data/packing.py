"""Packing, planned from the documents' lengths alone: which windows of which documents each row of
each stream of the global batch holds, epoch by epoch (trainer.data.loader reads and builds the rows).

The global batch is `global_batch_size` (B) packing streams. Each epoch the training documents are
shuffled from the seed, and each run of B consecutive documents gives one to every stream, the
longest to the stream with the fewest tokens so far (plain k mod B leaves the longest of 128 streams
~3% longer than the mean, which a finite pass pays in padding rows). A stream cuts its documents
into windows of at most `seq_len` next-token pairs (BOS prepended, so the first token is predicted
too; each window is a segment of its own, positions from 0) and packs them into rows.

Planned from `lengths.npy` alone, every process can compute, without reading any other process's
documents, how many batches an epoch has: as many as the longest stream has rows when the split is
in its reference order (training: the shuffle of seed 0). That count does not depend on the seed, so
a schedule built from `steps_per_epoch` and every process agree on it; a finite pass of another seed
is padded with empty rows or cut to it, at its very end (at B=128 on 330k stories: 0.9% padding
rows, no row cut). Hence a packer of our own rather than grain's First/BestFitPackIterDataset. It is
best-fit (a window goes where it leaves the least room) and emits one row at a time (the fullest,
when a window fits nowhere) instead of all bins at once: on TinyStories-like lengths at seq 256,
97-98% of positions hold a token.

A document with images is never cut (its images' soft tokens must meet their pixels in one row): it must
fit one window, and a row takes at most `images_per_row` images (the batch's image axis).

Streams flow from one epoch into the next (an open row may mix the end of one epoch with the start
of the next), so `epochs=None` never pads.
"""

import dataclasses

import numpy as np

from trainer.errors import UserError

# Rows open at once in each stream: more bins fill rows a little better (96.0% with 64) at the cost
# of a longer scan per window.
PACKING_BINS = 16
# The held-out split must not change with the training seed, so runs with different seeds share it.
_SPLIT_SEED = 0
# The training order whose packing defines the number of batches in an epoch, for every seed.
REFERENCE_SEED = 0
_epoch_rows_cache: dict[tuple, int] = {}


def _split_documents(data, split: str, eval_fraction: float) -> np.ndarray:
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
class Plan:
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
    image_counts: np.ndarray | None = None  # [documents] images each holds (data with images)
    images_per_row: int = 0
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

    def window_images(self, document: int) -> int:
        """The images of a window of `document` (its only window when it has any)."""
        return 0 if self.image_counts is None else int(self.image_counts[document])

    def window_pairs(self, document: int, window: int) -> int:
        return int(min(self.seq_len, self.lengths[document] - window * self.seq_len))

    def epoch_rows(self) -> int:
        """Batches in an epoch: rows of the longest stream packing the reference order's epoch 0."""
        if self.cache_key not in _epoch_rows_cache:
            reference = dataclasses.replace(self, seed=REFERENCE_SEED, epochs=1, _epochs={})
            rows = 0
            for stream in range(self.streams):
                packer, count = StreamPacker(reference, stream), 0
                while packer.next_row() is not None:
                    count += 1
                rows = max(rows, count)
            _epoch_rows_cache[self.cache_key] = rows
        return _epoch_rows_cache[self.cache_key]


class StreamPacker:
    """Best-fit packing of one stream's windows with at most `bins` rows open. A window goes into
    the open row it leaves least room in; when none has room, the fullest row is emitted and a new
    one is opened. A full-length window is a row by itself. Rows are lists of (document, window)."""

    def __init__(self, plan: Plan, stream: int):
        self.plan, self.stream = plan, stream
        self.epoch, self.cursor = 0, 0
        self.open_rows: list[list[tuple[int, int]]] = []
        self._free: list[int] = []
        self._free_images: list[int] = []  # images each open row may still take
        self._load_epoch()

    def _load_epoch(self) -> None:
        self._windows = self.plan.windows(self.stream, self.epoch) if not self.finished_epochs() else None

    def finished_epochs(self) -> bool:
        return self.plan.epochs is not None and self.epoch >= self.plan.epochs

    def _emit(self, index: int) -> list[tuple[int, int]]:
        self._free.pop(index)
        self._free_images.pop(index)
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
            images = self.plan.window_images(window[0])
            self.cursor += 1
            if size == seq_len:
                return [window]
            fits = min((i for i, free in enumerate(self._free) if free >= size and self._free_images[i] >= images),
                       key=self._free.__getitem__, default=None)
            if fits is not None:
                self.open_rows[fits].append(window)
                self._free[fits] -= size
                self._free_images[fits] -= images
                if self._free[fits] == 0:
                    return self._emit(fits)
                continue
            emitted = self._emit(int(np.argmin(self._free))) if len(self.open_rows) == self.plan.bins else None
            self.open_rows.append([window])
            self._free.append(seq_len - size)
            self._free_images.append(self.plan.images_per_row - images)
            if emitted is not None:
                return emitted
        return self._emit(0) if self.open_rows else None

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "open_rows": [[list(w) for w in row] for row in self.open_rows]}

    def set_state(self, state: dict) -> None:
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self.open_rows = [[tuple(w) for w in row] for row in state["open_rows"]]
        self._free = [self.plan.seq_len - sum(self.plan.window_pairs(*w) for w in row) for row in self.open_rows]
        self._free_images = [self.plan.images_per_row - sum(self.plan.window_images(w[0]) for w in row)
                             for row in self.open_rows]
        self._load_epoch()


def plan_split(data, *, seq_len, global_batch_size, seed, split, eval_fraction, epochs, bins) -> Plan:
    """The plan of `split` of `data` (a trainer.data.loader.TokenizedData: read for its lengths, counts and
    path) in `global_batch_size` streams; the eval split is one pass in document order."""
    if seq_len < 1 or global_batch_size < 1:
        raise UserError(f"sequence length {seq_len} and batch size {global_batch_size}: both must be at least 1")
    documents = _split_documents(data, split, eval_fraction)
    if split == "train" and len(documents) < global_batch_size:
        raise UserError(f"--batch-size {global_batch_size}: {len(documents)} training documents cannot fill "
                        f"{global_batch_size} batch rows; lower the batch size or add documents")
    counts = data.image_counts
    if counts is not None:
        too_long = documents[(counts[documents] > 0) & (data.lengths[documents] > seq_len)]
        if len(too_long):
            raise UserError(f"--seq-len {seq_len}: {len(too_long)} documents with images are longer (the longest "
                            f"{int(data.lengths[too_long].max())} tokens), and an image's tokens are never cut from its "
                            "row; raise --seq-len to that or shorten those rows")
    return Plan(lengths=data.lengths, documents=documents, seq_len=seq_len, streams=global_batch_size, seed=seed,
                shuffle=split == "train", epochs=1 if split == "eval" else epochs, bins=bins,
                cache_key=(data.path, data.documents, data.tokens, split, eval_fraction, seq_len, global_batch_size, bins),
                image_counts=counts, images_per_row=data.images_per_row)

