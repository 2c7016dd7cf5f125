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
_HEADER_LENGTH = 8
# A header of more than this is no safetensors file (the format's own limit is 100 MB).
_MAX_HEADER_BYTES = 100_000_000


class NotSafetensors(ValueError):
    """The file is not a safetensors file of a dtype read here."""


@dataclasses.dataclass(frozen=True)
class Entry:
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # the tensor's first byte in the file

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize


class SafetensorsFile:
    """The header of one file, and ranged reads of its tensors. `bytes_read` counts the tensor bytes
    read so far."""

    def __init__(self, path):
        self.path = epath.Path(path)
        self.bytes_read = 0
        with self.path.open("rb") as file:
            prefix = file.read(_HEADER_LENGTH)
            if len(prefix) < _HEADER_LENGTH:
                raise NotSafetensors(f"{self.path} is {len(prefix)} bytes long")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER_BYTES:
                raise NotSafetensors(f"{self.path} starts with a header length of {length} bytes")
            try:
                header = json.loads(file.read(length))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise NotSafetensors(f"{self.path}: its header is not JSON ({error})") from None
            size = file.seek(0, 2)
        data_start = _HEADER_LENGTH + length
        ends = [info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"]
        if data_start + max(ends, default=0) > size:
            raise NotSafetensors(f"{self.path} is cut short ({size} bytes; its header describes {data_start + max(ends)})")
        self.entries: dict[str, Entry] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise NotSafetensors(f"{self.path}: {name} is {info['dtype']}; weights are read as {', '.join(DTYPES)}")
            self.entries[name] = Entry(DTYPES[info["dtype"]], tuple(info["shape"]), data_start + info["data_offsets"][0])

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
