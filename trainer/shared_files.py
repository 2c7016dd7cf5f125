"""Files that the processes of one job share: made once, by process 0, and never seen half-written.

The hosts of a multi-host slice mount one bucket as their workdir, so what `--preset tiny`
generates there (corpus, tokenizer, prepared data) and what a run writes (config.json, the loss
plot) is one file for all of them. Each is written under a temporary name beside its final one and
renamed into place: a reader finds no file or the whole file, never a part. Which process makes
them is `trainer.run.mesh.process_zero_first`'s part. No JAX here: the data tools import this too.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import uuid
from collections.abc import Iterator


def temporary_sibling(path: pathlib.Path) -> pathlib.Path:
    """A fresh hidden name beside `path`, unique across hosts (process ids are not: every pod's
    trainer may be pid 1), with `path`'s suffix so that writers that go by the suffix still work."""
    return path.with_name(f".{path.stem}.partial-{uuid.uuid4().hex[:12]}{path.suffix}")


@contextlib.contextmanager
def replaced_atomically(path) -> Iterator[pathlib.Path]:
    """Yields a temporary path beside `path` to write a file or a directory at; when the block ends
    without an error it is renamed to `path` (replacing a file there), otherwise removed."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_sibling(path)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        elif temporary.exists():
            temporary.unlink()


def replace_directory(path: pathlib.Path, complete: pathlib.Path) -> None:
    """Renames the complete directory `complete` to `path`. An earlier `path` (the job's own earlier
    output) is renamed aside first and removed after: a directory cannot be renamed over one that
    holds files, and a reader never finds part of either."""
    if not path.exists():
        os.replace(complete, path)
        return
    earlier = temporary_sibling(path)
    os.replace(path, earlier)
    os.replace(complete, path)
    shutil.rmtree(earlier)


def write_text_atomically(path, text: str) -> None:
    with replaced_atomically(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
