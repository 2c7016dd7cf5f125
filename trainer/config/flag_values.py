"""The kinds of value the trainer's flags take: each parses a flag's text or raises argparse's error, which
the parser turns into one line naming the flag (trainer.errors.OneLineParser)."""

from __future__ import annotations

import argparse
import math

from trainer import contract

MESH_AXES = ("data", "fsdp")


def positive_int(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def word_or_positive_int(*words: str, counting: str):
    """An argparse type taking one of `words`, or a positive number of `counting`, as text."""
    def parse(text: str) -> str:
        if text in words:
            return text
        try:
            return str(positive_int(text))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {', '.join(words)} or a positive number of {counting}, got {text!r}") from None
    return parse


vocab_chunk_option = word_or_positive_int("auto", "none", counting="vocabulary rows")
local_checkpoint_interval = word_or_positive_int("auto", counting="steps")


def local_directory(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory on this host (host memory or a local disk), got ''")
    if "://" in text:
        raise argparse.ArgumentTypeError(f"expected a directory on this host (host memory or a local disk), got {text!r}: "
                                         "a bucket is --checkpoint-dir's tier")
    return text


def directory(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory (a local folder or a gs:// path), got ''")
    return text


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


SEED_LIMIT = 2**32  # what SentencePiece and numpy's generators take


def seed(text: str) -> int:
    value = integer(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {SEED_LIMIT - 1}, got {text!r}")
    return value


def port(text: str) -> int:
    value = integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < math.inf:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def published_parts(text: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in text.split(","))
    if not parts or any(part not in contract.PUBLISHED_PARTS for part in parts) or len(set(parts)) < len(parts):
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(contract.PUBLISHED_PARTS)}, comma-separated "
                                         f"(e.g. base,adapter), got {text!r}")
    return parts


def fraction(text: str) -> float:
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def parse_mesh(text: str) -> dict[str, int]:
    """`data=-1,fsdp=1` -> {"data": -1, "fsdp": 1}; -1 (at most one axis) fills the remaining devices."""
    mesh = {axis: 1 for axis in MESH_AXES}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name = name.strip()
        if not sep or name not in MESH_AXES:
            raise argparse.ArgumentTypeError(f"expected AXIS=SIZE pairs over {', '.join(MESH_AXES)} (e.g. data=-1,fsdp=4), got {text!r}")
        try:
            mesh[name] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"axis {name} needs an integer size, got {size!r}") from None
        if mesh[name] == 0 or mesh[name] < -1:
            raise argparse.ArgumentTypeError(f"axis {name} must be a positive size or -1, got {size!r}")
    if list(mesh.values()).count(-1) > 1:
        raise argparse.ArgumentTypeError(f"at most one axis may be -1, got {text!r}")
    return mesh


def format_mesh(sizes: dict[str, int]) -> str:
    return ",".join(f"{axis}={size}" for axis, size in sizes.items())


