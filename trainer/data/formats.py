"""Dataset files as streams of rows: plain text, JSON Lines or Parquet, each row a text or a chat.

A format name says the container and what a row holds: `text` (UTF-8 documents, each ended by a
separator), `jsonl-text`, `jsonl-chat`, `jsonl-prompt-response`, `parquet-text`, `parquet-chat`,
`parquet-prompt-response`. A JSONL row is an object with "text", "messages" (a list of
{"role", "content"}, a content
being a string or a list of Hugging Face's parts, {"type": "text", "text": ...} and {"type": "image", "image": ...})
or "prompt" and "response"; a Parquet file has columns of those names (a Hugging
Face dataset's split, say). `auto` takes the container from the file name's extension and the row
kind from the first row's keys (the columns of a Parquet file).

Every reader streams: the text in 1 MiB reads, JSONL a line at a time (a line longer than the row
limit is skipped, never held whole), Parquet a batch of rows at a time. A row that cannot be used
comes out as an InvalidRow, for the caller to count or refuse.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import pathlib
import urllib.parse

from trainer.errors import UserError, first_line

AUTO = "auto"
# Row kinds.
TEXT, CHAT, PROMPT_RESPONSE = "text", "chat", "prompt-response"
_KINDS = (TEXT, CHAT, PROMPT_RESPONSE)
FORMATS = (TEXT, *(f"jsonl-{kind}" for kind in _KINDS), *(f"parquet-{kind}" for kind in _KINDS))
DATA_FORMATS = (AUTO, *FORMATS)
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
PARQUET_EXTENSIONS = (".parquet", ".pq")
# The keys (JSONL) or columns (Parquet) of each row kind.
KIND_KEYS = {CHAT: ("messages",), PROMPT_RESPONSE: ("prompt", "response"), TEXT: ("text",)}

# Why a row is refused; the keys of meta.json's "skipped_rows".
NOT_JSON, MISSING_KEY, WRONG_TYPE, EMPTY_CONTENT, TOO_LONG = "not-json", "missing-key", "wrong-type", "empty-content", "too-long"

# What trainer.data.prepare does with an InvalidRow: stop naming it, or leave it out and count it.
FAIL, SKIP = "fail", "skip"
ON_BAD_ROW = (FAIL, SKIP)

_READ_BYTES = 1 << 20
# A text "document" this long means the separator never occurs where the user thinks it does.
_MAX_DOCUMENT_CHARS = 64 << 20
# A JSONL line or a Parquet row's text over this is refused as a row (reason too-long).
MAX_ROW_BYTES = 16 << 20
# Lines looked at to tell a JSONL file's row kind.
_DETECT_LINES = 1000
_PARQUET_BATCH_ROWS = 256


@dataclasses.dataclass(frozen=True)
class InvalidRow(Exception):
    """A row that cannot be used: `reason` is one of the constants above (or trainer.data.chat's), `detail` says what."""

    reason: str
    detail: str


@dataclasses.dataclass(frozen=True)
class ImagePart:
    """An image in a message: the part's "image" value as the row holds it (trainer.data.images reads it)."""

    value: object


@dataclasses.dataclass(frozen=True)
class Row:
    """One usable row: `text` (a text row) or `messages`, ((role, content), ...) as written (a chat); a
    content is a string, or a tuple of strings and ImageParts in order."""

    text: str | None = None
    messages: tuple[tuple[str, str | tuple[str | ImagePart, ...]], ...] | None = None


def content_text(content) -> str:
    """A message's text: its text parts joined."""
    return content if isinstance(content, str) else "".join(part for part in content if isinstance(part, str))


def kind_of(data_format: str) -> str:
    """The row kind of a format name: text, chat or prompt-response."""
    return TEXT if data_format == TEXT else data_format.split("-", 1)[1]


def _extension(name: str) -> str:
    return pathlib.PurePosixPath(urllib.parse.urlparse(name).path).suffix.lower()


def detect(path: pathlib.Path, requested: str, *, name: str) -> str:
    """The format of the file at `path`: `requested` unless it is auto. `name` is what the user gave (a
    URL's extension counts, as its download has none)."""
    if requested not in DATA_FORMATS:
        raise UserError(f"--data-format {requested}: unknown; choose from {', '.join(DATA_FORMATS)}")
    if requested != AUTO:
        return requested
    extension = _extension(name)
    if extension in JSONL_EXTENSIONS:
        return f"jsonl-{_jsonl_kind(path, name)}"
    if extension in PARQUET_EXTENSIONS:
        return f"parquet-{_kind_of_keys(_parquet_file(path, name).schema_arrow.names, name, 'columns')}"
    return TEXT


def _matching_kind(keys) -> str | None:
    return next((kind for kind, needed in KIND_KEYS.items() if all(key in keys for key in needed)), None)


def _kind_of_keys(keys, name: str, what: str) -> str:
    kind = _matching_kind(keys)
    if kind is None:
        raise UserError(f"data file {name}: its {what} ({', '.join(map(str, keys)) or 'none'}) have no \"messages\", "
                        "\"prompt\" and \"response\", or \"text\"; rename them or pass --data-format")
    return kind


def _jsonl_kind(path: pathlib.Path, name: str) -> str:
    """The kind of the first row among the first _DETECT_LINES that is an object with a kind's keys."""
    first_keys = None
    with path.open("rb") as lines:
        for _ in range(_DETECT_LINES):
            line = lines.readline(MAX_ROW_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_ROW_BYTES:  # too long to look at; the reader refuses it as a row
                while line and not line.endswith(b"\n"):
                    line = lines.readline(_READ_BYTES)
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                if (kind := _matching_kind(row)) is not None:
                    return kind
                first_keys = list(row) if first_keys is None else first_keys
    if first_keys is not None:
        raise UserError(f"data file {name}: no row of its first {_DETECT_LINES} lines has \"messages\", \"prompt\" and "
                        f"\"response\", or \"text\" (the first object's keys: {', '.join(first_keys) or 'none'}); "
                        "rename them or pass --data-format")
    raise UserError(f"data file {name}: none of its first {_DETECT_LINES} lines is a JSON object; pass JSON Lines "
                    "(one object a line) or --data-format")


def read_rows(path: pathlib.Path, data_format: str, *, name: str, separator: str, max_row_bytes: int = MAX_ROW_BYTES):
    """Yields (location, Row or InvalidRow) for each row of the file at `path` in `data_format`;
    location is "line N" (JSONL), "row N" (Parquet) or "document N" (text). Errors about the whole file
    (missing, not UTF-8 text, no separator, not Parquet, a column missing) are UserErrors naming `name`."""
    container, kind = ("text", TEXT) if data_format == TEXT else data_format.split("-", 1)
    if not path.is_file():
        raise UserError(f"data file {name}: not found; pass an existing file")
    if container == "text":
        return ((f"document {number}", Row(text=text))
                for number, text in enumerate(read_documents(path, separator, name=name), start=1))
    if container == "jsonl":
        return _jsonl_rows(path, kind, name=name, max_row_bytes=max_row_bytes)
    return _parquet_rows(path, kind, name=name, max_row_bytes=max_row_bytes)


def _row(values: dict, kind: str, max_row_bytes: int) -> Row:
    """The Row of one JSON object or Parquet row's `values` of `kind`; InvalidRow when it is not one."""
    missing = [key for key in KIND_KEYS[kind] if values.get(key) is None]
    if missing:
        raise InvalidRow(MISSING_KEY, f"no {' or '.join(repr(key) for key in missing)}")
    if kind == TEXT:
        text = _string(values["text"], "text")
        if not text.strip():
            raise InvalidRow(EMPTY_CONTENT, "\"text\" is empty")
        if len(text) > max_row_bytes:
            raise InvalidRow(TOO_LONG, f"text of {len(text)} characters, over the limit of {max_row_bytes}")
        return Row(text=text)
    if kind == PROMPT_RESPONSE:
        return _within(Row(messages=(("user", _string(values["prompt"], "prompt")),
                                     ("model", _string(values["response"], "response")))), max_row_bytes)
    messages = values["messages"]
    if not isinstance(messages, list) or not messages:
        raise InvalidRow(WRONG_TYPE, "\"messages\" is not a list of turns" if not isinstance(messages, list)
                         else "\"messages\" is empty")
    turns = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or message.get("role") is None or message.get("content") is None:
            raise InvalidRow(MISSING_KEY, f"message {number} is not an object with \"role\" and \"content\"")
        turns.append((_string(message["role"], f"message {number}'s role"), _content(message["content"], number)))
    return _within(Row(messages=tuple(turns)), max_row_bytes)


def _content(content, number: int):
    """A message's content: a string, or its list of text and image parts as a tuple."""
    if not isinstance(content, list):
        return _string(content, f"message {number}'s content")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(_string(part.get("text"), f"message {number}'s text part"))
        elif kind == "image" and part.get("image") is not None:
            parts.append(ImagePart(part["image"]))
        else:
            raise InvalidRow(WRONG_TYPE, f"message {number}'s content holds a part that is neither "
                                         "{\"type\": \"text\", \"text\": ...} nor {\"type\": \"image\", \"image\": ...}")
    return tuple(parts)


def _within(row: Row, max_row_bytes: int) -> Row:
    """`row`, unless its messages hold more characters than the row limit (a Parquet row has no line to measure)."""
    characters = sum(len(content_text(content)) for _, content in row.messages)
    if characters > max_row_bytes:
        raise InvalidRow(TOO_LONG, f"messages of {characters} characters, over the limit of {max_row_bytes}")
    return row


def _string(value, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidRow(WRONG_TYPE, f"{what} is a {type(value).__name__}, not a string")
    return value


def _jsonl_rows(path: pathlib.Path, kind: str, *, name: str, max_row_bytes: int):
    with path.open("rb") as lines:
        number = 0
        while line := lines.readline(max_row_bytes + 1):
            number += 1
            location = f"line {number}"
            if len(line) > max_row_bytes:
                while line and not line.endswith(b"\n"):  # the rest of the line, in bounded reads
                    line = lines.readline(_READ_BYTES)
                yield location, InvalidRow(TOO_LONG, f"a line over the limit of {max_row_bytes} bytes")
                continue
            if not line.strip():
                continue
            try:
                values = json.loads(line)
            except ValueError as error:
                yield location, InvalidRow(NOT_JSON, f"not JSON ({str(error).split(':')[0]})")
                continue
            if not isinstance(values, dict):
                yield location, InvalidRow(WRONG_TYPE, f"a JSON {type(values).__name__}, not an object")
                continue
            try:
                yield location, _row(values, kind, max_row_bytes)
            except InvalidRow as invalid:
                yield location, invalid


def _parquet_file(path: pathlib.Path, name: str):
    import pyarrow.parquet  # only for Parquet input

    try:
        return pyarrow.parquet.ParquetFile(path)
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"data file {name}: not a Parquet file ({first_line(error)}); pass one, "
                        "or --data-format for another kind of file") from None


def _parquet_rows(path: pathlib.Path, kind: str, *, name: str, max_row_bytes: int):
    file = _parquet_file(path, name)
    columns = list(KIND_KEYS[kind])
    missing = [column for column in columns if column not in file.schema_arrow.names]
    if missing:
        raise UserError(f"data file {name}: no column {', '.join(missing)} for --data-format parquet-{kind} (columns: "
                        f"{', '.join(file.schema_arrow.names)}); pass the --data-format of its columns")
    number = 0
    for batch in file.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns):
        for values in batch.to_pylist():
            number += 1
            try:
                yield f"row {number}", _row(values, kind, max_row_bytes)
            except InvalidRow as invalid:
                yield f"row {number}", invalid


def read_documents(input_path: pathlib.Path, separator: str, *, name=None):
    """Yields the documents of a UTF-8 text file, stripped, empty ones skipped. Streams the file
    and raises UserError for a missing, empty, binary or non-UTF-8 file or one without `separator`,
    naming the file as `name` (default: its path; the URL of a download)."""
    if not separator:
        raise UserError("--separator must not be empty; pass the string that ends each document")
    if not input_path.is_file():
        raise UserError(f"data file {input_path}: not found; pass an existing text file")
    input_name = name or input_path
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    pending, offset, separators, documents = "", 0, 0, 0
    with input_path.open("rb") as data:
        while True:
            chunk = data.read(_READ_BYTES)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                raise UserError(
                    f"data file {input_name}: not UTF-8 text (invalid byte near offset {offset + error.start}); "
                    "convert it to UTF-8"
                ) from None
            if "\x00" in text:
                raise UserError(f"data file {input_name}: binary content (NUL byte near offset {offset}); "
                                "pass a UTF-8 text file")
            offset += len(chunk)
            parts = (pending + text).split(separator)
            separators += len(parts) - 1
            pending = parts.pop()
            if len(pending) > _MAX_DOCUMENT_CHARS:
                raise UserError(
                    f"data file {input_name}: more than {_MAX_DOCUMENT_CHARS} characters without the separator "
                    f"{separator!r} before offset {offset}; pass the --separator that ends each document"
                )
            for part in parts + ([] if chunk else [pending]):
                if part.strip():
                    documents += 1
                    yield part.strip()
            if not chunk:
                break
    if documents == 0:
        raise UserError(f"data file {input_name}: no text in it; pass a file of documents separated by {separator!r}")
    if separators == 0:
        raise UserError(
            f"data file {input_name}: the separator {separator!r} never occurs; end each document with it "
            "(a single document too) or pass --separator"
        )
