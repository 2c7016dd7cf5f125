"""`python -m trainer.data.prepare`: tokenize a dataset once into sharded ArrayRecord files.

The input is read as a stream (a 2 GB file is never held in memory) of documents: plain text ended
by a separator, or the rows of a JSONL or Parquet file (trainer.data.formats), a chat or prompt/response
row rendered with Gemma's chat template (trainer.data.chat). Each is tokenized, EOS is appended, and each
becomes one record of little-endian int32 token ids; with loss on completions a chat's record is
followed by its loss mask, one bit a token (LOSS_MASK_BITS), then by its images' pixels (IMAGE_PIXELS: for a
model that reads images, trainer.data.images), whose counts a document `images.npy` holds. A bad row stops the run with its line
(--on-bad-row fail) or is left out and counted by reason in meta.json's "skipped_rows" (skip).
The output directory holds the shards, `lengths.npy` (tokens per document, which lets every process
plan the packing of the whole dataset without reading it) and `meta.json`. It is written in a
temporary sibling directory and renamed into place at the end, so a directory that has a readable
meta.json is complete; a run whose output is already complete (from the same source, with the
same tokenizer) changes nothing and downloads nothing.

`--input` is a local file or an http(s):// URL, downloaded into `--download-dir` for the run and
removed after it (the prepared output is what is kept). A gs:// object is read through a GCS FUSE
mount, as the preparation Job does: the mount authenticates as the pod's Google account and streams
the object, so no second way of reading buckets is needed here.
"""

import argparse
import array
import collections
import contextlib
import dataclasses
import http.client
import json
import os
import pathlib
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from trainer import contract
from trainer.data import chat, formats, images
from trainer.data.corpus import SEPARATOR
from trainer.data.tokenizer import OFFICIAL_TOKENIZER, Tokenizer, load_tokenizer
from trainer.errors import UserError, entry_point
from trainer.shared_files import replaced_atomically

# 2: meta.json says the data format and whether records carry a loss mask. 1 (text only, no mask) still reads.
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
# A record of masked data: its int32 token ids, then one bit a token (1 = trained), little bit order,
# padded to a whole byte. meta.json's "loss_mask" names this layout; null means tokens alone (all trained).
LOSS_MASK_BITS = "bits-after-tokens"
MASK_BIT_ORDER = "little"
META_FILE = contract.PREPARED_MARKER_FILE  # written last: its presence marks the output complete
LENGTHS_FILE = "lengths.npy"
IMAGE_COUNTS_FILE = "images.npy"
# After a record's tokens (and mask): each image's [size, size, 3] uint8 RGB pixels, in the order of its tokens.
IMAGE_PIXELS = "uint8-rgb-after-mask"
TOKEN_DTYPE = np.dtype("<i4")

_READ_BYTES = 1 << 20
# Text tokenized per call: large enough to keep the tokenizer threads busy, small enough to bound memory.
_ENCODE_BATCH_CHARS = 1 << 20
_SHARD_BYTES = 128 << 20
# --tokenizer official: the Gemma 3 tokenizer, which the trainer uses for every model but tiny.
OFFICIAL = "official"
_URL_SCHEMES = ("https://", "http://")
# For connecting and for each read, not for the whole download.
_DOWNLOAD_TIMEOUT_SECONDS = 60
# Answers that say "later" (request timeout, rate limit); other 4xx answers say the URL is wrong.
_TRY_LATER_STATUSES = (408, 429)


def _is_url(source: str) -> bool:
    return source.startswith(_URL_SCHEMES)


# What an output prepared before these options existed was prepared with.
_IDENTITY_DEFAULTS = {"data_format": formats.AUTO, "loss_on": chat.COMPLETIONS}


def _source_identity(source: str, options: dict) -> dict:
    """What makes a complete output one prepared from `source` with `options` (separator, data format
    and loss-on as asked for): a local file's resolved path and size; a URL itself, as what it serves
    cannot be known without downloading it, and a complete output is reused without a download."""
    if _is_url(source):
        return {"url": source, **options}
    if "://" in source:
        raise UserError(
            f"--input {source}: not a local file or an http(s):// URL; read a gs:// object through a GCS FUSE "
            "mount (as the preparation Job does) or copy it here with `gcloud storage cp`"
        )
    path = pathlib.Path(source)
    if not path.is_file():
        raise UserError(f"data file {path}: not found; pass an existing text file")
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, **options}


def _download(url: str, file, log) -> None:
    """Streams `url` into the open binary `file`. A URL the server refuses (4xx) or a host that cannot
    be reached is a UserError naming the URL; a server error (5xx), a "try later" answer or a
    transfer cut short raises ConnectionError, which a retry may get past (the preparation Job
    retries it)."""
    log(f"downloading {url}")
    try:
        response = urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_SECONDS)
    except urllib.error.HTTPError as error:
        if error.code >= 500 or error.code in _TRY_LATER_STATUSES:
            raise ConnectionError(f"--input {url}: HTTP {error.code} {error.reason} from the server") from error
        raise UserError(f"--input {url}: HTTP {error.code} {error.reason}; pass a URL that serves the corpus") from None
    except urllib.error.URLError as error:
        raise UserError(
            f"--input {url}: cannot reach the host ({error.reason}); check the URL and the network"
        ) from None
    received = 0
    with response:
        expected = response.headers.get("Content-Length")
        try:
            while chunk := response.read(_READ_BYTES):
                file.write(chunk)
                received += len(chunk)
        except (OSError, http.client.HTTPException) as error:
            raise ConnectionError(f"--input {url}: download cut off after {received} bytes ({error!r})") from error
    # http.client ends a read short without an error when the server closes the connection early.
    if expected is not None and received != int(expected):
        raise ConnectionError(f"--input {url}: download cut off after {received} of {expected} bytes")
    file.flush()
    log(f"downloaded {received} bytes")


@contextlib.contextmanager
def _local_file(source: str, download_dir, log):
    """Yields the local path of `source`: the file itself, or a URL downloaded into a hidden temporary
    file in `download_dir` (default: the system's temporary directory) that is removed afterwards."""
    if not _is_url(source):
        yield pathlib.Path(source)
        return
    directory = pathlib.Path(download_dir or tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".prepare-download-") as file:
        _download(source, file, log)
        yield pathlib.Path(file.name)


def _document_batches(documents, max_chars: int):
    batch, chars = [], 0
    for document in documents:
        batch.append(document)
        chars += sum(len(piece.text) if piece.image is None else piece.image.nbytes for piece in document)
        if chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


class _ShardWriter:
    """Writes records to shard-NNNNN.array_record files, starting a new one past `shard_bytes`, and
    tells `log` about each finished shard (a 2 GB corpus takes minutes)."""

    def __init__(self, directory: pathlib.Path, shard_bytes: int, log):
        self.directory, self.shard_bytes, self.log = directory, shard_bytes, log
        self.shards: list[dict] = []
        self._writer, self._bytes = None, 0

    def write(self, record: bytes) -> None:
        if self._writer is None or self._bytes >= self.shard_bytes:
            self._close_shard()
            name = f"shard-{len(self.shards):05d}.array_record"
            # group_size:1 keeps every record individually addressable (random access by the loader).
            self._writer = ArrayRecordWriter(str(self.directory / name), "group_size:1")
            self.shards.append({"file": name, "documents": 0})
            self._bytes = 0
        self._writer.write(record)
        self._bytes += len(record)
        self.shards[-1]["documents"] += 1

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            documents = sum(shard["documents"] for shard in self.shards)
            self.log(f"{self.shards[-1]['file']} written ({documents} documents so far)")

    def close(self) -> list[dict]:
        self._close_shard()
        return self.shards


def _with_pixels(pieces: list, layout: images.Layout | None, folder: pathlib.Path) -> list:
    """The pieces with each image part's pixels in place of the part; InvalidRow for an image that does not
    read, or any image where the model reads none (`layout` None)."""
    if not any(piece.image is not None for piece in pieces):
        return pieces
    if layout is None:
        raise formats.InvalidRow(images.BAD_IMAGE, "an image, and the model reads none: train a Gemma 3 of 4b or "
                                                   "more (or tiny) on it, or leave the images out")
    return [piece if piece.image is None else dataclasses.replace(
        piece, image=images.pixels(images.image_part(piece.image.value), layout.size, folder=folder)) for piece in pieces]


def _documents(rows, kind: str, *, loss_on: str, on_bad_row: str, name: str, refused: collections.Counter, first: list,
               layout: images.Layout | None, folder: pathlib.Path, warn):
    """The pieces (trainer.data.chat.Piece) of each usable row, images read. A refused row is the error with
    --on-bad-row fail; with skip it is counted by reason in `refused` (and the first kept in `first`), and a
    bad image is a line to `warn` too, naming it."""
    for location, row in rows:
        try:
            if isinstance(row, formats.InvalidRow):
                raise row
            if kind == formats.TEXT:
                yield [chat.Piece(row.text, trained=True)]
            else:
                yield _with_pixels(chat.render(row.messages, loss_on=loss_on), layout, folder)
        except formats.InvalidRow as invalid:
            if on_bad_row == formats.FAIL:
                raise UserError(f"data file {name} {location}: {invalid.reason} ({invalid.detail}); fix the row or "
                                "pass --on-bad-row skip to leave such rows out") from None
            if invalid.reason == images.BAD_IMAGE:
                warn(f"data file {name} {location}: skipped ({invalid.detail})")
            refused[invalid.reason] += 1
            first[:] = first or [f"{location}: {invalid.reason} ({invalid.detail})"]


def _write_prepared(input_path, source: dict, tokenizer: Tokenizer, directory: pathlib.Path, *, on_bad_row, workers,
                    shard_bytes, max_row_bytes, layout, log, warn):
    name = source.get("url") or str(input_path)
    data_format = formats.detect(input_path, source["data_format"], name=name)
    kind = formats.kind_of(data_format)
    loss_on = chat.ALL if kind == formats.TEXT else source["loss_on"]
    layout = layout if kind != formats.TEXT else None  # text rows hold no images
    masked = loss_on == chat.COMPLETIONS or layout is not None  # image tokens are never trained
    lengths, image_counts = array.array("i"), array.array("i")
    refused, first_refused = collections.Counter(), []
    writer = _ShardWriter(directory, shard_bytes, log)
    try:
        rows = formats.read_rows(input_path, data_format, name=name, separator=source["separator"],
                                 max_row_bytes=max_row_bytes)
        documents = _documents(rows, kind, loss_on=loss_on, on_bad_row=on_bad_row, name=name, refused=refused,
                               first=first_refused, layout=layout, folder=input_path.parent, warn=warn)
        for batch in _document_batches(documents, _ENCODE_BATCH_CHARS):
            for pieces, (ids, trained) in zip(batch, chat.tokenize(tokenizer, batch, threads=workers, image_layout=layout)):
                ids.append(tokenizer.eos_id)
                trained.append(trained[-1])  # EOS is trained after a trained end (a model turn, or text)
                record = np.asarray(ids, dtype=TOKEN_DTYPE).tobytes()
                if masked:
                    record += np.packbits(np.asarray(trained, bool), bitorder=MASK_BIT_ORDER).tobytes()
                pixels = [piece.image for piece in pieces if piece.image is not None]
                writer.write(record + b"".join(image.tobytes() for image in pixels))
                lengths.append(len(ids))
                image_counts.append(len(pixels))
    finally:
        shards = writer.close()
    skipped = sum(refused.values())
    if not lengths:
        if skipped:
            raise UserError(f"data file {name}: all {skipped} rows are bad ({_counts(refused)}); the first, "
                            f"{first_refused[0]}; fix the rows or pass another file")
        raise UserError(f"data file {name}: no rows in it; pass a file of rows ({data_format})")
    if skipped:
        log(f"skipped {skipped} bad rows of {skipped + len(lengths)} (--on-bad-row skip): {_counts(refused)}")
    np.save(directory / LENGTHS_FILE, np.frombuffer(lengths, dtype=np.int32))
    counts = np.frombuffer(image_counts, dtype=np.int32)
    if counts.any():
        np.save(directory / IMAGE_COUNTS_FILE, counts)
    meta = {
        "format": FORMAT_VERSION,
        "source": source,
        "data_format": data_format,
        "loss_on": loss_on,
        "loss_mask": LOSS_MASK_BITS if masked else None,
        "rows": skipped + len(lengths),
        "skipped_rows": dict(sorted(refused.items())),
        "tokenizer": {
            "path": tokenizer.path,
            "sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id,
            "eos_id": tokenizer.eos_id,
            "bos_id": tokenizer.bos_id,
        },
        "token_dtype": TOKEN_DTYPE.str,
        "documents": len(lengths),
        "tokens": int(np.sum(np.frombuffer(lengths, dtype=np.int32), dtype=np.int64)),
        "shards": shards,
        "lengths_file": LENGTHS_FILE,
        # Where a record's images are and how they read (null: no document has one).
        "images": {"pixels": IMAGE_PIXELS, "size": layout.size, "token_id": layout.token_id,
                   "soft_tokens": layout.soft_tokens, "images": int(counts.sum()), "counts_file": IMAGE_COUNTS_FILE,
                   "max_per_document": int(counts.max())} if counts.any() else None,
    }
    # meta.json last: inside the temporary directory, its presence marks the shards as complete.
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _counts(refused: collections.Counter) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in sorted(refused.items()))


def read_meta(directory) -> dict:
    """The meta of a complete prepared directory; UserError naming the directory otherwise."""
    directory = pathlib.Path(directory)
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        raise UserError(
            f"{directory}: not a complete prepared dataset (no readable {META_FILE}); "
            "prepare it with `python -m trainer.data.prepare` or remove it"
        ) from None
    if meta.get("format") not in READABLE_FORMATS:
        raise UserError(f"{directory}: prepared with format {meta.get('format')}, this trainer reads formats "
                        f"{', '.join(map(str, READABLE_FORMATS))}; prepare it again into another directory")
    files = [meta["lengths_file"], *([meta["images"]["counts_file"]] if meta.get("images") else []), *(s["file"] for s in meta["shards"])]
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise UserError(f"{directory}: incomplete prepared dataset, missing {', '.join(missing)}; prepare it again")
    return meta


def _check_reusable(meta: dict, directory: pathlib.Path, tokenizer: Tokenizer, source: dict) -> None:
    if meta["tokenizer"]["sha256"] != tokenizer.sha256:
        raise UserError(
            f"{directory}: already prepared with another tokenizer ({meta['tokenizer']['path']}); "
            f"remove it or pass another --output for tokenizer {tokenizer.path}"
        )
    # The meta records more than the identity (the size of a download); only the identity must match.
    prepared_from = meta["source"]
    if {key: prepared_from.get(key, _IDENTITY_DEFAULTS.get(key)) for key in source} != source:
        raise UserError(
            f"{directory}: already prepared from {prepared_from.get('url', prepared_from.get('path'))} "
            f"({prepared_from['bytes']} bytes, separator {prepared_from['separator']!r}, --data-format "
            f"{prepared_from.get('data_format', formats.AUTO)}, --loss-on {prepared_from.get('loss_on', chat.COMPLETIONS)}); "
            "remove it or pass another --output"
        )


def prepare(source, tokenizer: Tokenizer, output_dir, *, data_format=formats.AUTO, loss_on=chat.COMPLETIONS,
            on_bad_row=formats.FAIL, separator=SEPARATOR, workers=1, shard_bytes=_SHARD_BYTES, download_dir=None,
            max_row_bytes=formats.MAX_ROW_BYTES, image_layout: images.Layout | None = None,
            log=lambda message: None, warn=None) -> dict:
    """Tokenizes `source` (a local file or an http(s):// URL) with `tokenizer` into `output_dir` (see
    the module docstring) and returns its meta. `data_format` (trainer.data.formats; auto detects it),
    `loss_on` (trainer.data.chat: completions trains a chat's model turns only), `on_bad_row` (fail or
    skip); `workers` tokenizer threads; shards of about `shard_bytes` of token ids; a URL is downloaded
    into `download_dir`; images are read as `image_layout` says (None: a row with one is bad); `log` gets
    progress lines, `warn` (default `log`) the bad images skipped, one line each."""
    source, output_dir = str(source), pathlib.Path(output_dir)
    if data_format not in formats.DATA_FORMATS:
        raise UserError(f"--data-format {data_format}: unknown; choose from {', '.join(formats.DATA_FORMATS)}")
    if loss_on not in chat.LOSS_ON or on_bad_row not in formats.ON_BAD_ROW:
        raise UserError(f"--loss-on {loss_on} / --on-bad-row {on_bad_row}: choose --loss-on from "
                        f"{', '.join(chat.LOSS_ON)} and --on-bad-row from {', '.join(formats.ON_BAD_ROW)}")
    identity = _source_identity(source, {"separator": separator, "data_format": data_format, "loss_on": loss_on})
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output {output_dir}: is a file; pass a directory path")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        meta = read_meta(output_dir)
        _check_reusable(meta, output_dir, tokenizer, identity)
        log(f"{output_dir} is already prepared")
        return meta
    with _local_file(source, download_dir, log) as input_path:
        recorded = {**identity, "bytes": input_path.stat().st_size}
        try:
            with replaced_atomically(output_dir) as partial:  # replaces an empty output_dir, not a complete one
                partial.mkdir()
                return _write_prepared(input_path, recorded, tokenizer, partial, on_bad_row=on_bad_row,
                                       workers=workers, shard_bytes=shard_bytes, max_row_bytes=max_row_bytes,
                                       layout=image_layout, log=log, warn=warn or log)
        except OSError:
            if not (output_dir / META_FILE).is_file():
                raise
            # Another process finished the same output first; keep its copy.
            return read_meta(output_dir)


def _tokenizer_path(tokenizer: str) -> str:
    if tokenizer != OFFICIAL:
        return tokenizer
    return OFFICIAL_TOKENIZER


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.prepare",
        description="Tokenize a dataset once into sharded ArrayRecord files for the trainer's --data.",
    )
    parser.add_argument("--input", required=True,
                        help="a local file or an http(s):// URL: UTF-8 text of documents each ended by the separator, "
                             "JSON Lines (.jsonl) or Parquet (.parquet) of text, chat or prompt/response rows")
    parser.add_argument("--data-format", choices=formats.DATA_FORMATS, default=formats.AUTO,
                        help="what --input holds; auto: by its extension and first row's keys (default auto)")
    parser.add_argument("--loss-on", choices=chat.LOSS_ON, default=chat.COMPLETIONS,
                        help="for chat and prompt/response rows: train on the model's turns only (completions) "
                             "or on every token (all); text is trained on whole (default completions)")
    parser.add_argument("--on-bad-row", choices=formats.ON_BAD_ROW, default=formats.FAIL,
                        help="a row that is not usable (not JSON, a key missing, an unknown role, empty, too long, "
                             "no model turn to train on): stop with its line (fail) or leave it out and count it "
                             "in meta.json (skip) (default fail)")
    parser.add_argument("--download-dir",
                        help="where a URL --input is downloaded for the run, then removed (default: the system's "
                             "temporary directory); it needs room for the whole file")
    parser.add_argument("--tokenizer", required=True,
                        help=f"SentencePiece .model file (local path or gs://), or {OFFICIAL!r} for Gemma 3's")
    parser.add_argument("--output", required=True, help="output directory (created; reused when complete)")
    parser.add_argument("--separator", default=SEPARATOR, help=f"string that ends each document (default {SEPARATOR!r})")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="tokenizer threads (default: the number of CPUs)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


@entry_point()
def main(argv=None) -> int | None:
    args = parse_args(argv)
    meta = prepare(args.input, load_tokenizer(_tokenizer_path(args.tokenizer)), args.output, data_format=args.data_format,
                   loss_on=args.loss_on, on_bad_row=args.on_bad_row, separator=args.separator,
                   workers=args.workers, download_dir=args.download_dir,
                   log=lambda message: print(message, file=sys.stderr, flush=True))
    skipped = sum(meta.get("skipped_rows", {}).values())
    print(f"{args.output}: {meta.get('data_format', formats.TEXT)}, {meta['documents']} documents, {meta['tokens']} "
          f"tokens, {len(meta['shards'])} shards" + (f", {skipped} bad rows skipped" if skipped else ""))


if __name__ == "__main__":
    sys.exit(main())
