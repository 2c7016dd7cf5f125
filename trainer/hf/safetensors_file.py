"""A safetensors file read a tensor, or a run of a tensor's rows, at a time (local or gs://).

The format: 8 bytes of little-endian header length, a JSON header of {name: {dtype, shape,
data_offsets: [begin, end]}} (offsets into the data that follows it), then the tensors' bytes in
C order. A run of rows is one contiguous byte range, so a process reads only the rows of its
shards; the safetensors package reads whole files (or maps them, which gs:// cannot).
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct

import ml_dtypes
import numpy as np
from etils import epath

DTYPES = {"BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16), "F32": np.dtype(np.float32)}
# Every dtype the safetensors format knows, by its size in bits: a header is checked against these (as the
# `safetensors` library checks it) before a tensor of a dtype not in DTYPES is refused.
_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
         "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
         "U64": 64}
_HEADER_LENGTH = 8
# A header of more than this is no safetensors file (the format's own limit is 100 MB).
_MAX_HEADER_BYTES = 100_000_000
_METADATA = "__metadata__"


class NotSafetensors(ValueError):
    """The file is not a safetensors file of a dtype read here; the message names the tensor at fault."""


@dataclasses.dataclass(frozen=True)
class Entry:
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # the tensor's first byte in the file

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def _naturals(value, count: int | None = None) -> bool:
    """A JSON list of non-negative integers (of `count` of them)."""
    return (isinstance(value, list) and all(type(item) is int and item >= 0 for item in value)
            and (count is None or len(value) == count))


def _no_repeated_names(pairs: list) -> dict:
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise NotSafetensors(f"its header names {repeated[0]} twice")
    return dict(pairs)


def _checked_header(header, data_bytes: int) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """{name: (dtype, shape, begin)} of a parsed header, checked as the `safetensors` library checks it: each
    entry's dtype, shape and data_offsets of the right types, each tensor's bytes its shape times its dtype's
    size, and the tensors covering the `data_bytes` after the header end to end, without overlap or gap."""
    if not isinstance(header, dict):
        raise NotSafetensors(f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.get(_METADATA, {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise NotSafetensors(f"its header's {_METADATA} is not a map of strings to strings")
    entries = {}
    for name, info in header.items():
        if name == _METADATA:
            continue
        if not isinstance(info, dict):
            raise NotSafetensors(f"tensor {name}: its header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _BITS:
            raise NotSafetensors(f"tensor {name}: dtype {dtype!r} is none of the format's")
        if not _naturals(shape):
            raise NotSafetensors(f"tensor {name}: shape {shape!r} is not a list of sizes")
        if not _naturals(offsets, 2):
            raise NotSafetensors(f"tensor {name}: data_offsets {offsets!r} are not two byte offsets")
        begin, end = offsets
        bits = math.prod(shape) * _BITS[dtype]
        if begin > end:
            raise NotSafetensors(f"tensor {name}: data_offsets [{begin}, {end}] are reversed")
        if end > data_bytes:
            raise NotSafetensors(f"tensor {name}: data_offsets [{begin}, {end}] reach past the file's {data_bytes} "
                                 "data bytes (is it cut short?)")
        if bits != 8 * (end - begin):
            raise NotSafetensors(f"tensor {name}: data_offsets [{begin}, {end}] hold {end - begin} bytes, its shape "
                                 f"{shape} of {dtype} needs {bits / 8:g}")
        entries[name] = (dtype, tuple(shape), begin, end)
    covered, before = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != covered:
            what = f"overlap {before}'s, which end at {covered}" if begin < covered else f"leave bytes {covered} to {begin} unused"
            raise NotSafetensors(f"tensor {name}: data_offsets [{begin}, {end}] {what}")
        covered, before = end, name
    if covered != data_bytes:
        raise NotSafetensors(f"its tensors end at data byte {covered}, the file goes on to {data_bytes}")
    return {name: (dtype, shape, begin) for name, (dtype, shape, begin, _) in entries.items()}


class SafetensorsFile:
    """The header of one file, checked, and ranged reads of its tensors. `bytes_read` counts the tensor
    bytes read so far."""

    def __init__(self, path):
        self.path = epath.Path(path)
        self.bytes_read = 0
        with self.path.open("rb") as file:
            prefix = file.read(_HEADER_LENGTH)
            if len(prefix) < _HEADER_LENGTH:
                raise NotSafetensors(f"it is {len(prefix)} bytes long")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER_BYTES:
                raise NotSafetensors(f"it starts with a header length of {length} bytes")
            text = file.read(length)
            size = file.seek(0, 2)
        if len(text) < length:
            raise NotSafetensors(f"it is cut short in its header ({size} bytes, the header alone {_HEADER_LENGTH + length})")
        try:
            header = json.loads(text, object_pairs_hook=_no_repeated_names)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise NotSafetensors(f"its header is not JSON ({error})") from None
        data_start = _HEADER_LENGTH + length
        self.entries: dict[str, Entry] = {}
        for name, (dtype, shape, begin) in _checked_header(header, size - data_start).items():
            if dtype not in DTYPES:
                raise NotSafetensors(f"tensor {name} is {dtype}; weights are read as {', '.join(DTYPES)}")
            self.entries[name] = Entry(DTYPES[dtype], shape, data_start + begin)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of tensor `name` (along its first axis; a 0-d tensor is one row)."""
        entry = self.entries[name]
        count = math.prod(entry.shape[1:]) * (stop - start)
        with self.path.open("rb") as file:
            file.seek(entry.begin + start * entry.row_bytes)
            data = file.read(count * entry.dtype.itemsize)
        self.bytes_read += len(data)
        return np.frombuffer(data, entry.dtype, count).reshape(stop - start, *entry.shape[1:])

    def tensor(self, name: str) -> np.ndarray:
        return self.rows(name, 0, self.entries[name].shape[0])
