"""Crafted and damaged safetensors files through `--weights` (trainer.hf.load, as the trainer checks and loads
them): a seeded set of mutations of a real export's header and body (offsets, sizes, shapes, dtypes, the
header's type and length, truncation, random bytes). Each mutated file is refused in one UserError line or
loads exactly what the `safetensors` library reads from it: no traceback, no silent wrong read. The
library is the judge of what a file holds (safetensors.deserialize); a file it refuses, the trainer refuses.
Before the reader checked its header, a halved end offset, two tensors sharing bytes or reversed offsets
loaded wrong bytes, and a header that is a list or an entry without data_offsets were tracebacks."""

import json
import random
import struct

import jax
import numpy as np
import pytest
import safetensors

from trainer import export
from trainer.errors import UserError
from trainer.gemma3.config import Gemma3Config
from trainer.hf import load as hf_load
from trainer.model import models

MUTATIONS = 240
SEED = 42
# A Gemma 3 as small as the checks allow: every kind of tensor, a few KiB of weights.
SMALL = Gemma3Config(num_embed=64, embed_dim=16, hidden_dim=32, num_heads=2, head_dim=8, num_kv_heads=1, num_layers=2,
                     sliding_window_size=16, query_pre_attn_scalar=8)


def _pack(header, data: bytes) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _split(file: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<Q", file[:8])
    return json.loads(file[8:8 + length]), file[8 + length:]


def _canonical(tensors) -> bytes:
    """A file of what the library read (name, dtype, shape, bytes), laid out plainly: the arrays a reader must give."""
    header, data = {}, b""
    for name, info in sorted(tensors):
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [len(data), len(data) + len(info["data"])]}
        data += bytes(info["data"])
    return _pack(header, data)


def _mutations(original: bytes):
    """(what, mutated file) pairs, MUTATIONS of them, the same on every run."""
    header, data = _split(original)
    names = sorted(name for name in header if name != "__metadata__")

    def entry(rng, change):
        mutated = json.loads(json.dumps(header))
        name = rng.choice(names)
        change(rng, mutated[name], mutated, name)
        return _pack(mutated, data)

    def offsets(rng, info, *_):
        begin, end = info["data_offsets"]
        info["data_offsets"] = rng.choice([
            [begin, begin + (end - begin) // 2], [end, begin], [begin, end + rng.randint(1, 8)], [begin, end - rng.randint(1, 4)],
            [begin + rng.randint(1, 4), end], [begin - rng.randint(1, 4), end], [begin + 4, end + 4], [begin, len(data) + 8],
            [-1, end], [float(begin), end], [str(begin), end], [begin, end, end], [begin], None, [True, end]])

    def shared(rng, info, mutated, name):
        other = rng.choice([n for n in names if n != name])
        info["data_offsets"] = list(mutated[other]["data_offsets"])

    def swapped(rng, info, mutated, name):  # two tensors' bytes exchanged: a valid file of other values
        same = [n for n in names if n != name and mutated[n]["data_offsets"][1] - mutated[n]["data_offsets"][0]
                == info["data_offsets"][1] - info["data_offsets"][0]]
        other = rng.choice(same or names)
        info["data_offsets"], mutated[other]["data_offsets"] = mutated[other]["data_offsets"], info["data_offsets"]

    def shape(rng, info, *_):
        dims = list(info["shape"])
        info["shape"] = rng.choice([
            [dims[0] + 1, *dims[1:]], [max(dims[0] - 1, 0), *dims[1:]], dims[::-1], [*dims, 1], [1, *dims], [-dims[0], *dims[1:]],
            [float(d) for d in dims], [str(d) for d in dims], [], "x", None, [dims[0] * 2, *dims[1:]], [True, *dims[1:]]])

    def dtype(rng, info, *_):
        info["dtype"] = rng.choice(["F16", "BF16", "F64", "I32", "U8", "I64", "BOOL", "F8_E4M3", "F33", "f32", 7, None])

    def dtype_and_shape(rng, info, *_):  # the same bytes as two 16-bit values each: a valid file of other values
        info["dtype"] = rng.choice(["F16", "BF16"])
        info["shape"] = [*info["shape"][:-1], info["shape"][-1] * 2] if info["shape"] else [2]

    def removed(rng, info, mutated, name):
        rng.choice([lambda: mutated.pop(name), lambda: info.pop(rng.choice(["dtype", "shape", "data_offsets"])),
                    lambda: mutated.__setitem__(name + ".renamed", mutated.pop(name)),
                    lambda: mutated.__setitem__(name, [info["dtype"], info["shape"], info["data_offsets"]]),
                    lambda: info.__setitem__("extra", "ignored")])()

    def whole_header(rng):
        return _pack(rng.choice([[header], "header", 7, None, {**header, "__metadata__": {"format": 1}},
                                 {**header, "__metadata__": ["pt"]}, {**header, "__metadata__": {"format": "pt"}}]), data)

    def repeated_name(rng):
        name = rng.choice(names)
        text = json.dumps(header)
        copy = json.dumps({name: {**header[name], "data_offsets": [0, 0]}})[1:-1]
        return _pack((text[:-1] + ", " + copy + "}").encode(), data)

    def length(rng):
        text = json.dumps(header).encode()
        value = rng.choice([len(text) + rng.randint(1, 16), len(text) - rng.randint(1, 16), 0, 2**64 - 1, 100_000_001])
        return struct.pack("<Q", value) + text + data

    def truncated(rng):
        return original[:rng.randrange(len(original))]

    def appended(rng):
        return original + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))

    def flipped(rng, start, stop):
        mutated = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(start, stop)] = rng.randrange(256)
        return bytes(mutated)

    data_start = len(original) - len(data)
    kinds = {
        "offsets": lambda rng: entry(rng, offsets), "shared bytes": lambda rng: entry(rng, shared),
        "swapped bytes": lambda rng: entry(rng, swapped), "shape": lambda rng: entry(rng, shape),
        "dtype": lambda rng: entry(rng, dtype), "dtype and shape": lambda rng: entry(rng, dtype_and_shape),
        "entry": lambda rng: entry(rng, removed), "header": whole_header, "repeated name": repeated_name,
        "header length": length, "truncated": truncated, "appended": appended,
        "header bytes": lambda rng: flipped(rng, 0, data_start), "body bytes": lambda rng: flipped(rng, data_start, len(original)),
    }
    for index in range(MUTATIONS):
        what = list(kinds)[index % len(kinds)]
        yield what, kinds[what](random.Random(SEED * 100_000 + index))


@pytest.fixture(scope="module")
def model(tmp_path_factory, tokenizer):
    """A small model exported as bfloat16 by the trainer, its parameters as shapes, and a loader of a directory."""
    from tests.trainer.hf.test_export import random_params

    root = tmp_path_factory.mktemp("fuzz")
    (root / "model").mkdir()
    export.write_model(root / "model", SMALL, random_params(SMALL), tokenizer, dtype="bfloat16")
    expected = jax.eval_shape(lambda: models.init_params(SMALL, seed=0))
    shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), expected)

    def load(directory):
        found = hf_load.ModelDirectory(str(directory))
        found.check("small", SMALL, expected)
        return [np.asarray(leaf).view(np.uint32) for leaf in jax.tree.leaves(found.load(SMALL, expected, shardings))]

    return root, load


def test_every_mutation_is_refused_in_one_line_or_read_as_the_library_reads_it(model, tmp_path):
    root, load = model
    original = (root / "model" / "model.safetensors").read_bytes()
    directory = tmp_path / "mutated"
    directory.mkdir()
    (directory / "config.json").write_bytes((root / "model" / "config.json").read_bytes())
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "config.json").write_bytes((root / "model" / "config.json").read_bytes())
    outcomes, wrong = {}, []
    for what, mutated in _mutations(original):
        try:
            library = safetensors.deserialize(mutated)
        except Exception:  # noqa: BLE001 - any refusal of the library's
            library = None
        (directory / "model.safetensors").write_bytes(mutated)
        try:
            got = load(directory)
        except UserError as error:
            assert "\n" not in str(error)
            outcome = "refused"
        else:
            outcome = "read"
            if library is None:
                wrong.append(f"{what}: read a file the library refuses")
            else:
                (reference / "model.safetensors").write_bytes(_canonical(library))
                if not all(np.array_equal(a, b) for a, b in zip(got, load(reference))):
                    wrong.append(f"{what}: read other values than the library")
        outcomes.setdefault(what, []).append(outcome)
    assert wrong == []
    assert sum(len(results) for results in outcomes.values()) >= 200
    read = {what for what, results in outcomes.items() if "read" in results}
    # Valid files of other values are read (as the library reads them); the rest of the kinds are refused.
    assert {"swapped bytes", "body bytes"} <= read, outcomes
    assert all("refused" in results for what, results in outcomes.items() if what not in ("swapped bytes", "body bytes")), outcomes
