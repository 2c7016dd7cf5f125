"""`python -m trainer.prepare`: tokenize a raw text corpus once into sharded ArrayRecord files.

The input is read as a stream (a 2 GB file is never held in memory): documents end at a separator,
each is tokenized, EOS is appended, and each becomes one record of little-endian int32 token ids.
The output directory holds the shards, `lengths.npy` (tokens per document, which lets every process
plan the packing of the whole dataset without reading it) and `meta.json`. It is written in a
temporary sibling directory and renamed into place at the end, so a directory that has a readable
meta.json is complete; a run whose output is already complete does nothing.
"""

import argparse
import array
import codecs
import json
import os
import pathlib
import sys

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from trainer.corpus import SEPARATOR
from trainer.errors import UserError, entry_point
from trainer.shared_files import replaced_atomically
from trainer.tokenizer import Tokenizer, load_tokenizer

FORMAT_VERSION = 1
META_FILE = "meta.json"
LENGTHS_FILE = "lengths.npy"
TOKEN_DTYPE = np.dtype("<i4")

_READ_BYTES = 1 << 20
# Text tokenized per call: large enough to keep the tokenizer threads busy, small enough to bound memory.
_ENCODE_BATCH_CHARS = 1 << 20
_SHARD_BYTES = 128 << 20
# A "document" this long means the separator never occurs where the user thinks it does.
_MAX_DOCUMENT_CHARS = 64 << 20


def _source_identity(input_path: pathlib.Path, separator: str) -> dict:
    return {"path": str(input_path.resolve()), "bytes": input_path.stat().st_size, "separator": separator}


def read_documents(input_path: pathlib.Path, separator: str):
    """Yields the documents of a UTF-8 text file, stripped, empty ones skipped. Streams the file
    and raises UserError for a missing, empty, binary or non-UTF-8 file or one without `separator`."""
    if not separator:
        raise UserError("--separator must not be empty; pass the string that ends each document")
    if not input_path.is_file():
        raise UserError(f"data file {input_path}: not found; pass an existing text file")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    pending, offset, separators, documents = "", 0, 0, 0
    with input_path.open("rb") as data:
        while True:
            chunk = data.read(_READ_BYTES)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                raise UserError(
                    f"data file {input_path}: not UTF-8 text (invalid byte near offset {offset + error.start}); "
                    "convert it to UTF-8"
                ) from None
            if "\x00" in text:
                raise UserError(f"data file {input_path}: binary content (NUL byte near offset {offset}); "
                                "pass a UTF-8 text file")
            offset += len(chunk)
            parts = (pending + text).split(separator)
            separators += len(parts) - 1
            pending = parts.pop()
            if len(pending) > _MAX_DOCUMENT_CHARS:
                raise UserError(
                    f"data file {input_path}: more than {_MAX_DOCUMENT_CHARS} characters without the separator "
                    f"{separator!r} before offset {offset}; pass the --separator that ends each document"
                )
            for part in parts + ([] if chunk else [pending]):
                if part.strip():
                    documents += 1
                    yield part.strip()
            if not chunk:
                break
    if documents == 0:
        raise UserError(f"data file {input_path}: no text in it; pass a file of documents separated by {separator!r}")
    if separators == 0:
        raise UserError(
            f"data file {input_path}: the separator {separator!r} never occurs; end each document with it "
            "(a single document too) or pass --separator"
        )


def _document_batches(documents, max_chars: int):
    batch, chars = [], 0
    for document in documents:
        batch.append(document)
        chars += len(document)
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


def _write_prepared(input_path, tokenizer: Tokenizer, directory: pathlib.Path, *, separator, workers, shard_bytes,
                    log):
    lengths = array.array("i")
    writer = _ShardWriter(directory, shard_bytes, log)
    try:
        for batch in _document_batches(read_documents(input_path, separator), _ENCODE_BATCH_CHARS):
            for ids in tokenizer.encode_batch(batch, threads=workers):
                ids.append(tokenizer.eos_id)
                writer.write(np.asarray(ids, dtype=TOKEN_DTYPE).tobytes())
                lengths.append(len(ids))
    finally:
        shards = writer.close()
    np.save(directory / LENGTHS_FILE, np.frombuffer(lengths, dtype=np.int32))
    meta = {
        "format": FORMAT_VERSION,
        "source": _source_identity(input_path, separator),
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
    }
    # meta.json last: inside the temporary directory, its presence marks the shards as complete.
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def read_meta(directory) -> dict:
    """The meta of a complete prepared directory; UserError naming the directory otherwise."""
    directory = pathlib.Path(directory)
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, ValueError):
        raise UserError(
            f"{directory}: not a complete prepared dataset (no readable {META_FILE}); "
            "prepare it with `python -m trainer.prepare` or remove it"
        ) from None
    if meta.get("format") != FORMAT_VERSION:
        raise UserError(f"{directory}: prepared with format {meta.get('format')}, this trainer reads format "
                        f"{FORMAT_VERSION}; prepare it again")
    missing = [f for f in [meta["lengths_file"]] + [s["file"] for s in meta["shards"]] if not (directory / f).is_file()]
    if missing:
        raise UserError(f"{directory}: incomplete prepared dataset, missing {', '.join(missing)}; prepare it again")
    return meta


def _check_reusable(meta: dict, directory: pathlib.Path, tokenizer: Tokenizer, source: dict) -> None:
    if meta["tokenizer"]["sha256"] != tokenizer.sha256:
        raise UserError(
            f"{directory}: already prepared with another tokenizer ({meta['tokenizer']['path']}); "
            f"remove it or pass another --output for tokenizer {tokenizer.path}"
        )
    if meta["source"] != source:
        raise UserError(
            f"{directory}: already prepared from {meta['source']['path']} ({meta['source']['bytes']} bytes, "
            f"separator {meta['source']['separator']!r}); remove it or pass another --output"
        )


def prepare(input_path, tokenizer_path, output_dir, *, separator=SEPARATOR, workers=1,
            shard_bytes=_SHARD_BYTES, log=lambda message: None) -> dict:
    """Tokenizes `input_path` into `output_dir` (see the module docstring) and returns its meta.
    `workers` tokenizer threads; shards of about `shard_bytes` of token ids; `log` gets progress lines."""
    input_path, output_dir = pathlib.Path(input_path), pathlib.Path(output_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output {output_dir}: is a file; pass a directory path")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        meta = read_meta(output_dir)
        _check_reusable(meta, output_dir, tokenizer, _source_identity(input_path, separator))
        return meta
    try:
        with replaced_atomically(output_dir) as partial:  # replaces an empty output_dir, not a complete one
            partial.mkdir()
            return _write_prepared(input_path, tokenizer, partial, separator=separator, workers=workers,
                                   shard_bytes=shard_bytes, log=log)
    except OSError:
        if not (output_dir / META_FILE).is_file():
            raise
        # Another process finished the same output first; keep its copy.
        return read_meta(output_dir)


@entry_point()
def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.prepare",
        description="Tokenize a text corpus once into sharded ArrayRecord files for the trainer's --data.",
    )
    parser.add_argument("--input", required=True, help="UTF-8 text file of documents, each ended by the separator")
    parser.add_argument("--tokenizer", required=True, help="SentencePiece .model file (local path or gs://)")
    parser.add_argument("--output", required=True, help="output directory (created; reused when complete)")
    parser.add_argument("--separator", default=SEPARATOR, help=f"string that ends each document (default {SEPARATOR!r})")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="tokenizer threads (default: the number of CPUs)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    meta = prepare(args.input, args.tokenizer, args.output, separator=args.separator, workers=args.workers,
                   log=lambda message: print(message, file=sys.stderr, flush=True))
    print(f"{args.output}: {meta['documents']} documents, {meta['tokens']} tokens, {len(meta['shards'])} shards")


if __name__ == "__main__":
    sys.exit(main())
